/** The floor: the reference bridge plugin alone, exec'd by a long-lived bash, with the agent's own bridge config. */
import { spawn, type ChildProcess } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { KubenetPlugin } from '../../src/plugin/kubenet.js';
import type { AgentHarness } from '../../test/kit/agent-harness.js';
import { REF_BIN_DIR, type Op, type Pod } from './common.js';

/**
 * A bash process that execs the reference bridge plugin once per line it reads ("OP ID NETNS"),
 * with the config file given at start, and answers "ok START END" ($EPOCHREALTIME around the exec:
 * bash's own work is not counted) or "fail …". One call at a time.
 */
export class BashFloor {
  private readonly proc: ChildProcess;
  private readonly answers: string[] = [];
  private waiting: ((line: string) => void) | undefined;
  private exited = false;

  constructor(confFile: string) {
    const script = [
      'conf=$1; errf=$2',
      'while read -r op id netns; do',
      '  s=$EPOCHREALTIME',
      `  if CNI_COMMAND=$op CNI_CONTAINERID=$id CNI_NETNS=$netns CNI_IFNAME=eth0 CNI_PATH=${REF_BIN_DIR} ${REF_BIN_DIR}/bridge < "$conf" > /dev/null 2> "$errf"; then`,
      '    e=$EPOCHREALTIME; echo "ok $s $e"',
      '  else',
      '    echo "fail $(tr "\\n" " " < "$errf")"',
      '  fi',
      'done',
    ].join('\n');
    this.proc = spawn('bash', ['-c', script, 'bash', confFile, `${confFile}.stderr`], {
      stdio: ['pipe', 'pipe', 'inherit'],
      env: { LC_ALL: 'C', PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin' },
    });
    this.proc.once('exit', () => {
      this.exited = true;
      this.waiting?.('fail the bash floor process exited');
    });
    createInterface({ input: this.proc.stdout! }).on('line', (line) => {
      const w = this.waiting;
      this.waiting = undefined;
      if (w) w(line);
      else this.answers.push(line);
    });
  }

  /** Milliseconds of one bridge exec. */
  async run(op: Op, p: Pod): Promise<number> {
    if (this.exited) throw new Error('the bash floor process exited');
    const answer = new Promise<string>((resolve) => (this.waiting = resolve));
    this.proc.stdin!.write(`${op} ${p.id} ${p.netnsPath}\n`);
    const line = this.answers.shift() ?? (await answer);
    const [status = '', a = '', b = ''] = line.split(' ');
    if (status !== 'ok') throw new Error(`bridge ${op} from bash failed: ${line}`);
    return (Number(b) - Number(a)) * 1000;
  }

  async close(): Promise<void> {
    if (this.exited) return;
    const done = new Promise<void>((r) => this.proc.once('exit', () => r()));
    this.proc.stdin!.end();
    await done;
  }
}

/**
 * The floor's bridge config: the agent's own config generation (`c`: the agent's config), for
 * another bridge and ifb, subnet `cidr` and IPAM dir under `root`; the bash that execs it.
 */
export async function startFloor(
  c: AgentHarness['config'],
  names: { bridge: string; ifb: string; root: string },
  cidr: string,
): Promise<BashFloor> {
  const gen = new KubenetPlugin({
    bridgeName: names.bridge,
    ifbName: names.ifb,
    ipamDataDir: join(names.root, 'ipam-floor'),
    cniCacheDir: join(names.root, 'floor-cache'),
    shaperStateDir: join(names.root, 'floor-shaper'),
    ...(c.mtu !== undefined ? { mtu: c.mtu } : {}),
  });
  await gen.init({ getPodByName: () => undefined, getNetNS: () => '' }, c.hairpinMode, '0.0.0.0/0');
  await gen.event('pod-cidr-change', { 'pod-cidr': cidr });
  const conf = gen.currentConfig();
  gen.close();
  if (!conf) throw new Error('no bridge config generated for the floor');
  const confFile = join(names.root, 'floor-bridge.json');
  await writeFile(confFile, JSON.stringify(conf));
  return new BashFloor(confFile);
}
