// Every sink registers itself when imported; this is the list. Only the
// definitions load here: each implementation loads when its sink runs.
import './file/definition.js';
import './local/index.js';
import './api/definition.js';
