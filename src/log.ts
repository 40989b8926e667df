import { pino, type Logger } from 'pino';

export type { Logger };

/** The project's one root logger. Level from KUBENET_LOG_LEVEL (default info; silent under tests unless set). */
export function createLogger(opts: { level?: string; name?: string } = {}): Logger {
  const level = opts.level ?? process.env.KUBENET_LOG_LEVEL ?? 'info';
  return pino({ name: opts.name ?? 'kubenet', level });
}

/** A logger that discards everything; the default for library users who pass none. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
