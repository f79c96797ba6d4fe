#!/usr/bin/env node
// The malloc arenas are limited before anything else loads (and starts threads).
import { limitMallocArenas } from '../runtime/memory.js';
limitMallocArenas();
const { main } = await import('./main.js');
await main();
