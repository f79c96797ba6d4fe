// Every source registers itself when imported; this is the list. Only the
// definitions load here: each implementation loads when its source starts.
import './file/definition.js';
import './kube/definition.js';
import './api/definition.js';
