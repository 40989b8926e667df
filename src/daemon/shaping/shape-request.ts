/** `kubenet shape`'s request (POST /v1/pods/NS/NAME/limits on the agent socket) and answer: live-shaping.ts applies it. */
import { ConfigError } from '../../errors.js';
import { parseBandwidth, type BandwidthLimits } from '../../pod/index.js';

/** What `kubenet shape` asks: quantities as in the annotations; `clear` starts from no limits. */
export interface ShapeRequest {
  ingress?: string;
  egress?: string;
  clear?: boolean;
}

export interface ShapedPod {
  namespace: string;
  name: string;
  id: string;
  limits: BandwidthLimits;
  previous: BandwidthLimits;
  changed: boolean;
  /** Directions asked above the namespace's ceiling, which got the ceiling: one message each. */
  capped?: string[];
}

/** Parses a POST /v1/pods/NS/NAME/limits body. @throws ConfigError */
export function parseShapeRequest(body: unknown): { ingress?: number; egress?: number; clear: boolean } {
  if (typeof body !== 'object' || body === null || Array.isArray(body))
    throw new ConfigError('limits request: want a JSON object {"ingress"?, "egress"?, "clear"?}');
  const rec = body as Record<string, unknown>;
  for (const k of Object.keys(rec))
    if (!['ingress', 'egress', 'clear'].includes(k)) throw new ConfigError(`limits request: unknown field ${JSON.stringify(k)}`);
  const out: { ingress?: number; egress?: number; clear: boolean } = { clear: false };
  if (rec.clear !== undefined) {
    if (typeof rec.clear !== 'boolean') throw new ConfigError('limits request: "clear" must be a boolean');
    out.clear = rec.clear;
  }
  for (const dir of ['ingress', 'egress'] as const) {
    const v = rec[dir];
    if (v === undefined) continue;
    if (typeof v !== 'string') throw new ConfigError(`limits request: "${dir}" must be a quantity string such as "10M"`);
    out[dir] = parseBandwidth(v, `--${dir}`);
  }
  if (out.ingress === undefined && out.egress === undefined && !out.clear)
    throw new ConfigError('nothing to change: give --ingress, --egress or --clear');
  return out;
}
