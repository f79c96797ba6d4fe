// Every sink registers itself when imported; this is the list.
import './file/index.js';
import './local/index.js';
import './api/index.js';
