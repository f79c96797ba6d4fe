// Every backend registers itself when imported; this is the list. Only the
// definitions load here: each implementation loads when its backend runs.
import './log/index.js';
import './nft/index.js';
import './iptables/index.js';
import './ipvs/index.js';
import './userspace/index.js';
import './ebpf/index.js';
