// A compiled client for bench/ebpf.ts: what a first connection and short
// connections cost when the client adds almost nothing of its own (a Node
// client's event loop adds ~100 us to every connection, more than any proxy).
// Built by the benchmark with the C compiler to-ebpf needs anyway.
//
//   probe first ENDPOINT CLIENT HOST PORT N WARMUP
//     a server on ENDPOINT:8080 (a thread: accept, read one byte, answer
//     "ok", close); N times a new TCP connection from CLIENT to HOST:PORT,
//     blocking: prints one JSON line {"connect":[us...],"answer":[us...]}:
//     connect() alone (on loopback the handshake completes inside it), and
//     connect + one byte sent + the answer read.
//   probe rate ENDPOINT CLIENT HOST PORT MS CONC
//     the same server with CONC threads; CONC clients loop connect, send,
//     read the answer, close for MS ms: prints connections per second.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int listener;
static struct sockaddr_in target, source;
static long long deadline_ns;
static long long done;

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

static void *serve(void *arg) {
  (void)arg;
  for (;;) {
    int s = accept(listener, NULL, NULL);
    if (s < 0) continue;
    char b;
    if (read(s, &b, 1) == 1) (void)!write(s, "ok", 2);
    close(s);
  }
  return NULL;
}

/* one connection: connect, one byte, the answer; the two times in ns (connect alone, to the answer) */
static int one(long long *connect_ns, long long *answer_ns) {
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0) die("socket");
  int on = 1; /* the port is chosen at connect(), for the whole 4-tuple */
  setsockopt(c, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &on, sizeof on);
  if (bind(c, (struct sockaddr *)&source, sizeof source) < 0) die("bind client");
  long long t0 = now_ns();
  if (connect(c, (struct sockaddr *)&target, sizeof target) < 0) {
    close(c);
    return -1;
  }
  long long t1 = now_ns();
  char b[2];
  if (write(c, "x", 1) != 1 || read(c, b, 2) <= 0) {
    close(c);
    return -1;
  }
  long long t2 = now_ns();
  close(c);
  if (connect_ns) *connect_ns = t1 - t0;
  if (answer_ns) *answer_ns = t2 - t0;
  return 0;
}

static void *client(void *arg) {
  (void)arg;
  long long n = 0;
  while (now_ns() < deadline_ns)
    if (one(NULL, NULL) == 0) n++;
  __atomic_add_fetch(&done, n, __ATOMIC_RELAXED);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 8) {
    fprintf(stderr, "usage: probe first|rate ENDPOINT CLIENT HOST PORT N|MS WARMUP|CONC\n");
    return 2;
  }
  int rate = strcmp(argv[1], "rate") == 0;
  struct sockaddr_in at = {.sin_family = AF_INET, .sin_port = htons(8080)};
  if (inet_pton(AF_INET, argv[2], &at.sin_addr) != 1) die("endpoint");
  source.sin_family = AF_INET;
  if (inet_pton(AF_INET, argv[3], &source.sin_addr) != 1) die("client");
  target.sin_family = AF_INET;
  target.sin_port = htons(atoi(argv[5]));
  if (inet_pton(AF_INET, argv[4], &target.sin_addr) != 1) die("host");
  listener = socket(AF_INET, SOCK_STREAM, 0);
  int one_ = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one_, sizeof one_);
  if (bind(listener, (struct sockaddr *)&at, sizeof at) < 0) die("bind");
  if (listen(listener, 4096) < 0) die("listen");
  int n = atoi(argv[6]), k = atoi(argv[7]);
  int servers = rate ? k : 1;
  for (int i = 0; i < servers; i++) {
    pthread_t t;
    pthread_create(&t, NULL, serve, NULL);
  }
  if (rate) {
    for (int i = 0; i < 200; i++) one(NULL, NULL);
    long long t0 = now_ns();
    deadline_ns = t0 + (long long)n * 1000000LL;
    pthread_t *ts = calloc(k, sizeof *ts);
    for (int i = 0; i < k; i++) pthread_create(&ts[i], NULL, client, NULL);
    for (int i = 0; i < k; i++) pthread_join(ts[i], NULL);
    printf("%.1f\n", done / ((now_ns() - t0) / 1e9));
    return 0;
  }
  long long *cs = calloc(n, sizeof *cs), *as = calloc(n, sizeof *as);
  for (int i = 0; i < k; i++) one(NULL, NULL);
  for (int i = 0; i < n; i++)
    if (one(&cs[i], &as[i]) < 0) die("connect");
  printf("{\"connect\":[");
  for (int i = 0; i < n; i++) printf("%s%.2f", i ? "," : "", cs[i] / 1e3);
  printf("],\"answer\":[");
  for (int i = 0; i < n; i++) printf("%s%.2f", i ? "," : "", as[i] / 1e3);
  printf("]}\n");
  return 0;
}
