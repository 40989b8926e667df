/**
 * `kubenet --help`, `kubenet help CMD` and `kubenet CMD --help`: the usage of each command and, for
 * `daemon`, every config key with its flag, type, default and meaning, from CONFIG_KEYS (the one
 * description of each key; docs/config.md's table comes from the same).
 */
import { CONFIG_KEYS, type ConfigKey, type ConfigKeySpec } from '../daemon/config/config.js';
import { wrap } from './wrap.js';

export { wrap };

const COMMANDS: Record<string, { usage: string; about: string; options?: Array<[string, string]> }> = {
  daemon: {
    usage: 'kubenet daemon [--config FILE] [flags]',
    about:
      'The node agent: sets pods up and shapes them for the container runtime through its CNI binary. Every config key below is a key of the YAML file given with --config and a flag; a flag wins over the file, the file over the default.',
  },
  status: {
    usage: 'kubenet status [--config FILE] [--socket PATH] [--json] [--window SECONDS]',
    about: "What the agent knows: its mode, pod CIDR, routes, and each pod's addresses, limits and measured rates.",
    options: [
      ['--json', 'the report as JSON'],
      ['--window SECONDS', 'the window of the measured rates (default 5)'],
    ],
  },
  shape: {
    usage: 'kubenet shape NAMESPACE/NAME [--ingress Q] [--egress Q] [--clear] [--config FILE] [--socket PATH]',
    about:
      "Changes a running pod's limits: the given directions, the others stay. In a cluster the pod's annotations stay the source of truth: such a change lasts until they change.",
    options: [
      ['--ingress Q', 'limit of traffic to the pod, a Kubernetes quantity such as 10M'],
      ['--egress Q', 'limit of traffic from the pod'],
      ['--clear', 'starts from no limits (alone: removes both)'],
    ],
  },
  top: {
    usage: 'kubenet top [-d SECONDS] [-b] [-n FRAMES] [--config FILE] [--socket PATH]',
    about: 'Pods by measured rate against their limits, refreshed like top(1).',
    options: [
      ['-d SECONDS', 'refresh interval (default 1)'],
      ['-b', 'batch mode: plain frames, no screen control'],
      ['-n FRAMES', 'stop after this many frames'],
    ],
  },
  health: {
    usage: 'kubenet health [--config FILE] [--socket PATH]',
    about: "Exits 0 when the agent answers and is ready (the DaemonSet's probe), 1 otherwise.",
  },
  uninstall: {
    usage: 'kubenet uninstall [--config FILE] [--dry-run] [--force] [flags]',
    about:
      "Removes from this node everything the agent made, once the agent is gone (its DaemonSet deleted): the conflist first, then the CNI binary, the ifbs, the bridge, the iptables/ebtables chains and rules, the routes of protocol 98, the IPAM, state and socket files; never another program's. Refuses while the agent answers on its socket, and, unless --force, while pods still have veths, records or addresses. Prints what it removed and what it kept and why; exits 0 when the node is clean, 1 when something was left. Takes the agent's config (the same --config, and any config flag) to know the names and directories.",
    options: [
      ['--dry-run', 'says what it would remove, and changes nothing'],
      ['--force', 'also removes the pods still there (their veths): they lose their network'],
    ],
  },
};

/** All commands' usage lines. */
export function usage(): string {
  return [
    'usage:',
    ...Object.values(COMMANDS).map((c) => `  ${c.usage}`),
    '',
    'kubenet help COMMAND (or kubenet COMMAND --help) says more.',
  ].join('\n');
}

/** One command's help; undefined for an unknown command. */
export function commandHelp(cmd: string): string | undefined {
  const c = COMMANDS[cmd];
  if (!c) return undefined;
  const out = [`usage: ${c.usage}`, '', ...wrap(c.about, 100, '')];
  if (cmd !== 'daemon') {
    const options: Array<[string, string]> = [
      ...(c.options ?? []),
      ['--config FILE', "the agent's config file, for its socket"],
      ['--socket PATH', `the agent's socket (default: the config's, else ${CONFIG_KEYS.socket.default ?? ''})`],
    ];
    out.push('', 'options:');
    for (const [flag, text] of options) out.push(`  ${flag.padEnd(18)} ${text}`);
    return out.join('\n');
  }
  out.push('', 'config keys (YAML key, flag, type, default):');
  for (const [key, spec] of Object.entries(CONFIG_KEYS) as Array<[ConfigKey, ConfigKeySpec]>) {
    const type = spec.values ? spec.values.join(' | ') : spec.type === 'string[]' ? 'list (flag: comma-separated)' : spec.type;
    out.push('', `  ${key}  ${spec.flag}  ${type}  default: ${spec.default ?? 'unset'}`);
    out.push(...wrap(spec.description.replace(/`/g, ''), 96, '    '));
  }
  return out.join('\n');
}
