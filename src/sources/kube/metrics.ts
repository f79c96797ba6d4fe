// client-go's REST client metrics, with its names, labels and buckets: the
// Kubernetes / Proxy dashboard charts kube-proxy's API request rate by code
// and latency by verb from these. One count per attempt (a 401 retried with
// fresh credentials counts twice); a watch counts when its headers arrive;
// a request that gets no answer counts with code "<error>", as client-go's.
import { Counter, Histogram } from 'prom-client';
import { registry } from '../../runtime/metrics.js';

export const restClientMetrics = {
  requests: new Counter({
    name: 'rest_client_requests_total',
    help: 'Number of HTTP requests, partitioned by status code, method, and host.',
    labelNames: ['code', 'method', 'host'] as const,
    registers: [registry],
  }),
  duration: new Histogram({
    name: 'rest_client_request_duration_seconds',
    help: 'Request latency in seconds. Broken down by verb, and host.',
    labelNames: ['verb', 'host'] as const,
    buckets: [0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60],
    registers: [registry],
  }),
};

/** The series of a client of host at 0, before its first answer (a dashboard shows 0, not "no data"). */
export function initRestClientSeries(host: string): void {
  restClientMetrics.requests.inc({ code: '200', method: 'GET', host }, 0);
  restClientMetrics.duration.zero({ verb: 'GET', host });
}

/** One request's outcome: its status code, or "<error>" when no answer came. */
export function observeRequest(host: string, code: number | undefined, seconds: number): void {
  restClientMetrics.requests.inc({ code: code === undefined ? '<error>' : String(code), method: 'GET', host });
  restClientMetrics.duration.observe({ verb: 'GET', host }, seconds);
}
