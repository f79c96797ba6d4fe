// to-ebpf's flag defaults, apart from the datapath so that registering the
// backend (for --help and flags) loads none of it.
export const DEFAULT_BPFFS = '/sys/fs/bpf/kpng';
export const DEFAULT_MAX_SERVICE_PORTS = 65536;
export const DEFAULT_MAX_ENDPOINTS = 262144;
