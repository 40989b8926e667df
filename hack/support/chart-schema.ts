/**
 * Prints the Helm chart's values.schema.json: the chart's own values (image, resources, placement,
 * the metrics TLS Secret) and `config`, whose schema is generated from the config-key table
 * (src/daemon/config/keys.ts configKeysJsonSchema), so the chart refuses what the agent would.
 * hack/render-manifest.sh writes it; test/manifests/chart.test.ts checks the file is this output.
 */
import { configKeysJsonSchema } from '../../src/daemon/config/keys.js';

export function chartValuesSchema(): Record<string, unknown> {
  return {
    $schema: 'http://json-schema.org/draft-07/schema#',
    title: 'kubenet chart values',
    type: 'object',
    additionalProperties: false,
    required: ['image', 'config'],
    properties: {
      image: {
        type: 'object',
        additionalProperties: false,
        required: ['repository'],
        properties: {
          repository: { type: 'string', minLength: 1, description: 'The agent image (hack/build-image.sh builds kubenet-ts:<version>).' },
          tag: { type: 'string', description: "The image tag; empty: the chart's appVersion." },
          pullPolicy: { type: 'string', enum: ['Always', 'IfNotPresent', 'Never'] },
        },
      },
      config: {
        ...configKeysJsonSchema(),
        description: "The agent's config file (the ConfigMap's config.yaml): the keys of `kubenet daemon --help`.",
      },
      resources: { type: 'object', description: "The agent container's resources." },
      tolerations: { type: 'array', items: { type: 'object' } },
      nodeSelector: { type: 'object', additionalProperties: { type: 'string' } },
      priorityClassName: { type: 'string' },
      metricsTLSSecret: { type: 'string', description: 'A kubernetes.io/tls Secret for the metrics port; empty: none.' },
    },
  };
}

if (import.meta.url === `file://${process.argv[1]}`) process.stdout.write(`${JSON.stringify(chartValuesSchema(), null, 2)}\n`);
