// Every backend registers itself when imported; this is the list.
import './log/index.js';
import './nft/index.js';
import './iptables/index.js';
import './ipvs/index.js';
import './userspace/index.js';
import './ebpf/index.js';
