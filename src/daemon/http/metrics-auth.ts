/**
 * Who may read the metrics port with `metricsAuth: kubernetes`, decided as kubelet and
 * kube-rbac-proxy decide it: the caller's bearer token is authenticated by the API server
 * (TokenReview), and the user it names is authorized for `get` on the non-resource URL asked for
 * (SubjectAccessReview), so one ClusterRole rule (`nonResourceURLs: ["/metrics"], verbs: ["get"]`)
 * grants a scraper access. Answers are cached (a scrape every 15 s costs the API server nothing
 * after the first): an authenticated token 2 min, a refused one 30 s; a decision 2 min, a denial
 * 30 s. Reviews of the same token in flight are shared, and the cache is bounded, so a flood of
 * made-up tokens costs the API server at most one review each, never memory.
 */
import { createHash } from 'node:crypto';
import type { Logger } from '../../log.js';
import { moduleLogger } from '../../util/module-logger.js';
import { KubeApi, loadKubeConfig, type KubeClientOptions } from '../kube/watch.js';

/** The answer to one request: 200 (go on), 401 (no or bad token), 403 (not allowed), 503 (the API server could not say). */
export interface AuthDecision {
  status: 200 | 401 | 403 | 503;
  /** The authenticated user, when there is one. */
  user?: string;
  /** Why not, for the answer's body and the log. */
  reason?: string;
}

/** What the metrics port asks (fakes in tests implement it). */
export interface MetricsAuthorizer {
  /** `authorization`: the request's Authorization header; `path`: the URL path asked for. */
  authorize(authorization: string | undefined, path: string): Promise<AuthDecision>;
}

interface UserInfo {
  username: string;
  uid?: string;
  groups?: string[];
  extra?: Record<string, string[]>;
}

/** The two reviews (KubeApi satisfies it through `postJson`). */
export interface ReviewApi {
  postJson<T>(path: string, body: unknown): Promise<T>;
}

const AUTHN_OK_MS = 120_000;
const AUTHN_FAIL_MS = 30_000;
const AUTHZ_OK_MS = 120_000;
const AUTHZ_DENY_MS = 30_000;
const MAX_CACHED = 1024;

/** A bounded map whose entries expire; the oldest goes first when it is full. */
class ExpiringCache<V> {
  private readonly m = new Map<string, { value: V; until: number }>();
  get(key: string, now: number): V | undefined {
    const e = this.m.get(key);
    if (!e) return undefined;
    if (e.until > now) return e.value;
    this.m.delete(key);
    return undefined;
  }
  set(key: string, value: V, ttlMs: number, now: number): void {
    this.m.delete(key);
    if (this.m.size >= MAX_CACHED) this.m.delete(this.m.keys().next().value as string);
    this.m.set(key, { value, until: now + ttlMs });
  }
  get size(): number {
    return this.m.size;
  }
}

export class KubeMetricsAuth implements MetricsAuthorizer {
  private readonly users = new ExpiringCache<UserInfo | null>();
  private readonly decisions = new ExpiringCache<boolean>();
  private readonly inFlight = new Map<string, Promise<AuthDecision>>();
  /** Reviews sent to the API server (tests, logs). */
  readonly sent = { tokenReviews: 0, accessReviews: 0 };

  constructor(
    private readonly api: ReviewApi,
    private readonly log: Logger,
    private readonly now: () => number = Date.now,
  ) {}

  static fromClient(o: Pick<KubeClientOptions, 'kubeconfig' | 'kubeConfig' | 'logger'>): KubeMetricsAuth {
    return new KubeMetricsAuth(new KubeApi(loadKubeConfig(o)), moduleLogger(o.logger, 'metrics-auth'));
  }

  async authorize(authorization: string | undefined, path: string): Promise<AuthDecision> {
    const token = /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? '')?.[1];
    if (!token) return { status: 401, reason: 'a bearer token is required (Authorization: Bearer TOKEN)' };
    const key = `${createHash('sha256').update(token).digest('hex')} ${path}`;
    const shared = this.inFlight.get(key);
    if (shared) return shared;
    const p = this.decide(token, key, path).finally(() => this.inFlight.delete(key));
    this.inFlight.set(key, p);
    return p;
  }

  private async decide(token: string, key: string, path: string): Promise<AuthDecision> {
    const tokenKey = key.slice(0, 64);
    let user = this.users.get(tokenKey, this.now());
    if (user === undefined) {
      try {
        this.sent.tokenReviews++;
        const review = await this.api.postJson<{ status?: { authenticated?: boolean; user?: UserInfo; error?: string } }>(
          '/apis/authentication.k8s.io/v1/tokenreviews',
          {
            apiVersion: 'authentication.k8s.io/v1',
            kind: 'TokenReview',
            spec: { token },
          },
        );
        user = review.status?.authenticated && review.status.user?.username ? review.status.user : null;
        this.users.set(tokenKey, user, user ? AUTHN_OK_MS : AUTHN_FAIL_MS, this.now());
        if (!user)
          this.log.info({ path, error: review.status?.error }, 'metrics request refused: the API server did not authenticate its token');
      } catch (err) {
        this.log.warn({ err, path }, 'metrics request refused: the TokenReview failed');
        return { status: 503, reason: 'the API server could not review the token; try again' };
      }
    }
    if (!user) return { status: 401, reason: 'the API server did not authenticate this token' };
    let allowed = this.decisions.get(key, this.now());
    if (allowed === undefined) {
      try {
        this.sent.accessReviews++;
        const review = await this.api.postJson<{ status?: { allowed?: boolean; reason?: string } }>(
          '/apis/authorization.k8s.io/v1/subjectaccessreviews',
          {
            apiVersion: 'authorization.k8s.io/v1',
            kind: 'SubjectAccessReview',
            spec: {
              user: user.username,
              ...(user.uid ? { uid: user.uid } : {}),
              ...(user.groups ? { groups: user.groups } : {}),
              ...(user.extra ? { extra: user.extra } : {}),
              nonResourceAttributes: { path, verb: 'get' },
            },
          },
        );
        allowed = review.status?.allowed === true;
        this.decisions.set(key, allowed, allowed ? AUTHZ_OK_MS : AUTHZ_DENY_MS, this.now());
        if (!allowed)
          this.log.info({ user: user.username, path, reason: review.status?.reason }, 'metrics request refused: not authorized');
      } catch (err) {
        this.log.warn({ err, path, user: user.username }, 'metrics request refused: the SubjectAccessReview failed');
        return { status: 503, user: user.username, reason: 'the API server could not review the access; try again' };
      }
    }
    return allowed
      ? { status: 200, user: user.username }
      : {
          status: 403,
          user: user.username,
          reason: `user "${user.username}" may not get ${path} (grant it with a ClusterRole rule: nonResourceURLs ["${path}"], verbs ["get"])`,
        };
  }
}
