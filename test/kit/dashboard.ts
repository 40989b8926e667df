/** The Grafana dashboard of manifests/monitoring as the tests read it: its PromQL, ready to send to Prometheus. */

export interface Dashboard {
  templating: { list: Array<{ name: string; query?: unknown }> };
  panels: Array<{ id: number; type: string; title: string; targets?: Array<{ expr: string; refId: string }> }>;
}

export interface DashboardQuery {
  title: string;
  /** As in the dashboard. */
  expr: string;
  /** With the dashboard's variables as Grafana fills them for "All" and a 1 m rate interval. */
  query: string;
}

export function dashboardQueries(d: Dashboard, rateInterval = '1m'): DashboardQuery[] {
  return d.panels.flatMap((p) =>
    (p.targets ?? []).map((tg) => ({
      title: `${p.title} ${tg.refId}`,
      expr: tg.expr,
      query: tg.expr.replaceAll('$__rate_interval', rateInterval).replaceAll('$node', '.*').replaceAll('$namespace', '.*'),
    })),
  );
}
