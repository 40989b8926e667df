/** The agent's log lines (pino's JSON) as tests read them. */

/**
 * The keys of a JSON object's top level in the order written, repeats kept (JSON.parse keeps only
 * the last of a repeated key, so it cannot tell `"module":"a","module":"b"` from one key).
 */
export function topLevelKeys(line: string): string[] {
  const keys: string[] = [];
  let depth = 0;
  let expectKey = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (c === '"') {
      let j = i + 1;
      while (j < line.length && line[j] !== '"') j += line[j] === '\\' ? 2 : 1;
      if (depth === 1 && expectKey) keys.push(JSON.parse(line.slice(i, j + 1)) as string);
      expectKey = false;
      i = j;
    } else if (c === '{' || c === '[') {
      depth++;
      expectKey = depth === 1 && c === '{';
    } else if (c === '}' || c === ']') {
      depth--;
    } else if (c === ',' && depth === 1) {
      expectKey = true;
    }
  }
  return keys;
}

/** The lines of a log whose top level repeats a key, each with the keys repeated. */
export function linesRepeatingKeys(text: string): string[] {
  return text
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .flatMap((l) => {
      const keys = topLevelKeys(l);
      const twice = [...new Set(keys.filter((k, i) => keys.indexOf(k) !== i))];
      return twice.length > 0 ? [`${twice.join(',')}: ${l.slice(0, 200)}`] : [];
    });
}
