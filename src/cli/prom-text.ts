/**
 * A parser of the Prometheus text exposition format (0.0.4), as much as `kubectl kubenet` reads
 * from the agents and the tests check of the agent's own /metrics: `# HELP` (escapes `\\` and `\n`)
 * and `# TYPE` lines, other comments skipped, samples with labels (escapes `\\`, `\"`, `\n` in
 * values; a trailing comma allowed), values as Go writes them (NaN, +Inf, -Inf) and an optional
 * timestamp. Samples of a histogram or summary (`_bucket`, `_sum`, `_count`) belong to its family.
 * Whatever the format forbids and a reader could get wrong is refused with the line: a second TYPE
 * for a name, a TYPE after the family's samples, a label twice in a sample, the same series twice,
 * an unknown escape, an unterminated value.
 */
import { KubenetError } from '../errors.js';

export type MetricType = 'counter' | 'gauge' | 'histogram' | 'summary' | 'untyped';

export interface Sample {
  /** The sample's own name (a histogram's `x_bucket`, `x_sum`, `x_count`). */
  name: string;
  labels: Record<string, string>;
  value: number;
  timestampMs?: number;
}

export interface MetricFamily {
  name: string;
  type: MetricType;
  help?: string;
  samples: Sample[];
}

/** The text is not valid exposition; `line` is 1-based. */
export class ExpositionError extends KubenetError {
  constructor(
    message: string,
    readonly line: number,
  ) {
    super(`line ${line}: ${message}`);
  }
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*/;
const TYPES = new Set<string>(['counter', 'gauge', 'histogram', 'summary', 'untyped']);
const SUFFIXES: Record<string, readonly string[]> = { histogram: ['_bucket', '_sum', '_count'], summary: ['_sum', '_count'] };

/** A float as the format writes it: Go's ParseFloat forms, NaN and ±Inf. */
function parseValue(s: string, line: number, what: string): number {
  const lower = s.toLowerCase();
  if (lower === 'nan') return NaN;
  if (lower === '+inf' || lower === 'inf') return Infinity;
  if (lower === '-inf') return -Infinity;
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(s) && !/^[-+]?0[xX][0-9a-fA-F]+$/.test(s))
    throw new ExpositionError(`${what} ${JSON.stringify(s)} is not a number`, line);
  return Number(s);
}

function unescapeHelp(s: string): string {
  return s.replace(/\\(.)/g, (all, c: string) => (c === 'n' ? '\n' : c === '\\' ? '\\' : all));
}

/** Every family of the text, by name, in order of appearance. */
export function parseExposition(text: string): Map<string, MetricFamily> {
  const families = new Map<string, MetricFamily>();
  const typed = new Set<string>();
  const series = new Set<string>();
  const family = (name: string): MetricFamily => {
    let f = families.get(name);
    if (!f) families.set(name, (f = { name, type: 'untyped', samples: [] }));
    return f;
  };
  /** The family a sample name belongs to: its own, or the histogram/summary it is a suffix of. */
  const owner = (name: string): MetricFamily => {
    for (const [type, suffixes] of Object.entries(SUFFIXES)) {
      for (const suffix of suffixes) {
        if (!name.endsWith(suffix)) continue;
        const base = families.get(name.slice(0, -suffix.length));
        if (base?.type === type) return base;
      }
    }
    return family(name);
  };
  const lines = text.split('\n');
  lines.forEach((raw, i) => {
    const n = i + 1;
    const line = raw.replace(/\r$/, '').trim();
    if (line === '') return;
    if (line.startsWith('#')) {
      const m = /^#\s+(HELP|TYPE)\s+(\S+)(?:[ \t]+(.*))?$/.exec(line);
      if (!m) return; // a comment
      const [, kind, name = '', rest = ''] = m;
      if (!NAME.test(name) || NAME.exec(name)?.[0] !== name) throw new ExpositionError(`invalid metric name ${JSON.stringify(name)}`, n);
      const f = family(name);
      if (kind === 'HELP') {
        if (f.help !== undefined) throw new ExpositionError(`second HELP for ${name}`, n);
        f.help = unescapeHelp(rest);
        return;
      }
      const type = rest.trim();
      if (!TYPES.has(type)) throw new ExpositionError(`unknown type ${JSON.stringify(type)} for ${name}`, n);
      if (typed.has(name)) throw new ExpositionError(`second TYPE for ${name}`, n);
      if (f.samples.length > 0) throw new ExpositionError(`TYPE for ${name} after its samples`, n);
      typed.add(name);
      f.type = type as MetricType;
      return;
    }
    const sample = parseSample(line, n);
    const key = `${sample.name}{${Object.entries(sample.labels)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([k, v]) => `${k}=${JSON.stringify(v)}`)
      .join(',')}}`;
    if (series.has(key)) throw new ExpositionError(`series ${key} twice`, n);
    series.add(key);
    owner(sample.name).samples.push(sample);
  });
  return families;
}

function parseSample(line: string, n: number): Sample {
  const name = NAME.exec(line)?.[0];
  if (!name) throw new ExpositionError(`not a sample: ${JSON.stringify(line.slice(0, 80))}`, n);
  let i = name.length;
  const labels: Record<string, string> = {};
  const skipSpace = () => {
    while (line[i] === ' ' || line[i] === '\t') i++;
  };
  skipSpace();
  if (line[i] === '{') {
    i++;
    for (;;) {
      skipSpace();
      if (line[i] === '}') {
        i++;
        break;
      }
      const label = LABEL_NAME.exec(line.slice(i))?.[0];
      if (!label) throw new ExpositionError(`invalid label name at column ${i + 1}`, n);
      i += label.length;
      skipSpace();
      if (line[i] !== '=') throw new ExpositionError(`expected = after label ${label}`, n);
      i++;
      skipSpace();
      if (line[i] !== '"') throw new ExpositionError(`expected " to open the value of label ${label}`, n);
      i++;
      let value = '';
      for (;;) {
        const c = line[i];
        if (c === undefined) throw new ExpositionError(`unterminated value of label ${label}`, n);
        i++;
        if (c === '"') break;
        if (c === '\\') {
          const e = line[i++];
          if (e === 'n') value += '\n';
          else if (e === '\\' || e === '"') value += e;
          else throw new ExpositionError(`invalid escape \\${e ?? ''} in the value of label ${label}`, n);
          continue;
        }
        value += c;
      }
      if (Object.hasOwn(labels, label)) throw new ExpositionError(`label ${label} twice`, n);
      labels[label] = value;
      skipSpace();
      if (line[i] === ',') {
        i++;
        continue;
      }
      if (line[i] === '}') {
        i++;
        break;
      }
      throw new ExpositionError(`expected , or } after the value of label ${label}`, n);
    }
  }
  const rest = line
    .slice(i)
    .trim()
    .split(/[ \t]+/);
  if (rest.length < 1 || rest[0] === '' || rest.length > 2)
    throw new ExpositionError(`expected a value (and a timestamp) after ${name}`, n);
  const sample: Sample = { name, labels, value: parseValue(rest[0] ?? '', n, 'value') };
  if (rest[1] !== undefined) {
    if (!/^-?\d+$/.test(rest[1])) throw new ExpositionError(`timestamp ${JSON.stringify(rest[1])} is not an integer`, n);
    sample.timestampMs = Number(rest[1]);
  }
  return sample;
}

/** The samples of `name` (a family, or a histogram's `_bucket` etc.) whose labels include `match`. */
export function samplesOf(families: Map<string, MetricFamily>, name: string, match: Record<string, string> = {}): Sample[] {
  const f = families.get(name) ?? families.get(name.replace(/_(bucket|sum|count)$/, ''));
  return (f?.samples ?? []).filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v));
}
