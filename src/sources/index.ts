// Every source registers itself when imported; this is the list.
import './file/index.js';
import './kube/index.js';
import './api/index.js';

