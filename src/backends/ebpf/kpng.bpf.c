// SPDX-License-Identifier: (Apache-2.0 OR GPL-2.0)
// kpng's socket-level load balancer. cgroup sock_addr programs rewrite a
// Service address to one of its endpoints when a socket connects (TCP,
// connected UDP) or sends (unconnected UDP), and show the Service address
// again to getpeername and to recvmsg (UDP replies). kpng changes the maps,
// never the programs. The map layouts are checked against this object's BTF
// by layout.ts at load: change both together.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define KPNG_ECONNREFUSED 111
#define KPNG_AF_INET 2
#define KPNG_AF_INET6 10

/* a Service address: ClusterIP, externalIP, LB IP, or node address + NodePort */
struct kpng_svc_key {
	__u8 addr[16]; /* IPv4 in the first 4 bytes, the rest 0 */
	__u16 port;    /* network byte order */
	__u8 proto;    /* IPPROTO_TCP, IPPROTO_UDP */
	__u8 family;   /* 4 or 6 */
};

#define KPNG_SVC_REFUSE 1 /* no endpoint anywhere: refuse (kube-proxy's REJECT) */
#define KPNG_SVC_HOST_ONLY 2 /* localhost NodePorts: the node's own network namespace only (a pod's localhost is its own) */

struct kpng_svc_value {
	__u32 id;            /* the endpoint list (one per Service port, family and kind of traffic) */
	__u16 count;         /* endpoints in it: kpng_endpoints {id, 0..count-1} */
	__u16 flags;
	__u32 affinity_secs; /* ClientIP affinity timeout, 0 without */
	__u32 pad;
};

struct kpng_ep_key {
	__u32 id;
	__u32 index;
};

struct kpng_ep_value {
	__u8 addr[16];
	__u16 port; /* network byte order */
	__u8 family;
	__u8 pad;
};

/* affinity by client: a pod is a network namespace, so its cookie stands for the client IP */
struct kpng_affinity_key {
	__u64 netns;
	__u32 id;
	__u32 pad;
};

struct kpng_affinity_value {
	__u64 last_ns;
	__u32 index;
	__u32 pad;
	struct kpng_ep_value ep; /* checked against the list: a removed endpoint is not used again */
	__u32 pad2;
};

/* what a socket was translated to, so getpeername and recvmsg can say where it meant to go */
struct kpng_rev_key {
	__u64 cookie;
	struct kpng_ep_value ep;
	__u32 pad;
};

enum { KPNG_C_TRANSLATED, KPNG_C_REFUSED, KPNG_C_MISSED, KPNG_C_REVERSED, KPNG_C_MAX };

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct kpng_svc_key);
	__type(value, struct kpng_svc_value);
} kpng_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__type(key, struct kpng_ep_key);
	__type(value, struct kpng_ep_value);
} kpng_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct kpng_affinity_key);
	__type(value, struct kpng_affinity_value);
} kpng_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct kpng_rev_key);
	__type(value, struct kpng_ep_value);
} kpng_reverse SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, KPNG_C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} kpng_counters SEC(".maps");

/* [0]: the node's network namespace cookie, written by kpng at start */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} kpng_host_netns SEC(".maps");

static __always_inline void count(__u32 what)
{
	__u64 *c = bpf_map_lookup_elem(&kpng_counters, &what);
	if (c)
		*c += 1;
}

static __always_inline int same_ep(const struct kpng_ep_value *a, const struct kpng_ep_value *b)
{
	__u32 x[4], y[4];
	__builtin_memcpy(x, a->addr, 16);
	__builtin_memcpy(y, b->addr, 16);
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] && a->port == b->port && a->family == b->family;
}

/*
 * Reads the socket's address; family 6 with an IPv4-mapped address (a
 * dual-stack socket reaching an IPv4 Service) reads as family 4. Returns the
 * family the address is, and *mapped when it came IPv4-mapped.
 */
static __always_inline int read_addr(struct bpf_sock_addr *ctx, int family, __u8 *addr, __u16 *port, int *mapped)
{
	__u32 a[4] = {};
	*mapped = 0;
	if (family == 4) {
		a[0] = ctx->user_ip4;
	} else {
		a[0] = ctx->user_ip6[0];
		a[1] = ctx->user_ip6[1];
		a[2] = ctx->user_ip6[2];
		a[3] = ctx->user_ip6[3];
		if (a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff)) {
			a[0] = a[3];
			a[2] = a[3] = 0;
			*mapped = 1;
			family = 4;
		}
	}
	__builtin_memcpy(addr, a, 16);
	*port = (__u16)ctx->user_port;
	return family;
}

static __always_inline void write_addr(struct bpf_sock_addr *ctx, int family, int mapped, const __u8 *addr, __u16 port)
{
	__u32 a[4];
	__builtin_memcpy(a, addr, 16);
	if (family == 4 && !mapped) {
		ctx->user_ip4 = a[0];
	} else if (mapped) {
		ctx->user_ip6[0] = 0;
		ctx->user_ip6[1] = 0;
		ctx->user_ip6[2] = bpf_htonl(0xffff);
		ctx->user_ip6[3] = a[0];
	} else {
		ctx->user_ip6[0] = a[0];
		ctx->user_ip6[1] = a[1];
		ctx->user_ip6[2] = a[2];
		ctx->user_ip6[3] = a[3];
	}
	ctx->user_port = port;
}

static __always_inline struct kpng_ep_value *pick(struct bpf_sock_addr *ctx, const struct kpng_svc_value *sv)
{
	struct kpng_ep_key ek = { .id = sv->id };
	struct kpng_ep_value *ep;
	if (sv->affinity_secs) {
		struct kpng_affinity_key ak = { .netns = bpf_get_netns_cookie(ctx), .id = sv->id };
		struct kpng_affinity_value *av = bpf_map_lookup_elem(&kpng_affinity, &ak);
		__u64 now = bpf_ktime_get_ns();
		if (av && av->index < sv->count && now - av->last_ns < (__u64)sv->affinity_secs * 1000000000ULL) {
			ek.index = av->index;
			ep = bpf_map_lookup_elem(&kpng_endpoints, &ek);
			if (ep && same_ep(ep, &av->ep)) {
				av->last_ns = now;
				return ep;
			}
		}
		ek.index = bpf_get_prandom_u32() % sv->count;
		ep = bpf_map_lookup_elem(&kpng_endpoints, &ek);
		if (ep) {
			struct kpng_affinity_value nv = { .last_ns = now, .index = ek.index, .ep = *ep };
			bpf_map_update_elem(&kpng_affinity, &ak, &nv, BPF_ANY);
		}
		return ep;
	}
	ek.index = bpf_get_prandom_u32() % sv->count;
	return bpf_map_lookup_elem(&kpng_endpoints, &ek);
}

/* connect and sendmsg: 1 lets the call go on (translated or not), 0 fails it with the set error */
static __always_inline int translate(struct bpf_sock_addr *ctx, int hook_family)
{
	struct kpng_svc_key k = {};
	struct kpng_svc_value *sv;
	struct kpng_ep_value *ep;
	int mapped;
	int family = read_addr(ctx, hook_family, k.addr, &k.port, &mapped);
	k.family = family;
	k.proto = (__u8)ctx->protocol;
	sv = bpf_map_lookup_elem(&kpng_services, &k);
	if (!sv)
		return 1;
	if (sv->flags & KPNG_SVC_HOST_ONLY) {
		__u32 zero = 0;
		__u64 *host = bpf_map_lookup_elem(&kpng_host_netns, &zero);
		if (!host || *host != bpf_get_netns_cookie(ctx))
			return 1;
	}
	if (sv->count == 0) {
		if (sv->flags & KPNG_SVC_REFUSE) {
			count(KPNG_C_REFUSED);
			bpf_set_retval(-KPNG_ECONNREFUSED);
			return 0;
		}
		return 1; /* left to the other backend (e.g. to-nft's drop) */
	}
	ep = pick(ctx, sv);
	if (!ep || ep->family != family) {
		count(KPNG_C_MISSED); /* an update in flight: the packet goes on untranslated */
		return 1;
	}
	struct kpng_rev_key rk = { .cookie = bpf_get_socket_cookie(ctx), .ep = *ep };
	struct kpng_ep_value orig = { .port = k.port, .family = family };
	__builtin_memcpy(orig.addr, k.addr, 16);
	bpf_map_update_elem(&kpng_reverse, &rk, &orig, BPF_ANY);
	write_addr(ctx, family, mapped, ep->addr, ep->port);
	count(KPNG_C_TRANSLATED);
	return 1;
}

/* getpeername and recvmsg: the endpoint's address becomes the Service's again */
static __always_inline int reverse(struct bpf_sock_addr *ctx, int hook_family)
{
	struct kpng_rev_key rk = { .cookie = bpf_get_socket_cookie(ctx) };
	struct kpng_ep_value *orig;
	int mapped;
	int family = read_addr(ctx, hook_family, rk.ep.addr, &rk.ep.port, &mapped);
	rk.ep.family = family;
	orig = bpf_map_lookup_elem(&kpng_reverse, &rk);
	if (orig) {
		write_addr(ctx, family, mapped, orig->addr, orig->port);
		count(KPNG_C_REVERSED);
	}
	return 1;
}

SEC("cgroup/connect4")
int kpng_connect4(struct bpf_sock_addr *ctx) { return translate(ctx, 4); }

SEC("cgroup/connect6")
int kpng_connect6(struct bpf_sock_addr *ctx) { return translate(ctx, 6); }

SEC("cgroup/sendmsg4")
int kpng_sendmsg4(struct bpf_sock_addr *ctx) { return translate(ctx, 4); }

SEC("cgroup/sendmsg6")
int kpng_sendmsg6(struct bpf_sock_addr *ctx) { return translate(ctx, 6); }

SEC("cgroup/recvmsg4")
int kpng_recvmsg4(struct bpf_sock_addr *ctx) { return reverse(ctx, 4); }

SEC("cgroup/recvmsg6")
int kpng_recvmsg6(struct bpf_sock_addr *ctx) { return reverse(ctx, 6); }

SEC("cgroup/getpeername4")
int kpng_getpeername4(struct bpf_sock_addr *ctx) { return reverse(ctx, 4); }

SEC("cgroup/getpeername6")
int kpng_getpeername6(struct bpf_sock_addr *ctx) { return reverse(ctx, 6); }

char _license[] SEC("license") = "GPL";
