// Runs the official RocketMQ 5 Node.js client (rocketmq-client-nodejs) against a proxy, for the
// system tests. Usage: node rmq_node_driver.js ENDPOINT STEPS_JSON; prints one JSON line: the
// results of the steps, in order. RMQ_DRIVER_AK / RMQ_DRIVER_SK: the client's sessionCredentials.
// Steps: {op: "produce", topic, count} -> [{i, id}]; {op: "consume", group, topic, want} -> [{id, body}].
// A step that throws gives {error, code}: the client's exception with a code (down its causes), and message.
const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

const [endpoints, stepsJson] = process.argv.slice(2);
const accessKey = process.env.RMQ_DRIVER_AK || '';
const sessionCredentials = accessKey ? { accessKey, accessSecret: process.env.RMQ_DRIVER_SK || '' } : undefined;

async function produce(step) {
  const producer = new Producer({ endpoints, sessionCredentials, topics: [step.topic], requestTimeout: 5000 });
  await producer.startup();
  try {
    const out = [];
    for (let i = 0; i < step.count; i++) {
      const receipt = await producer.send({ topic: step.topic, tag: 'node', body: Buffer.from(`${step.topic}:${i}`) });
      out.push({ i, id: receipt.messageId });
    }
    return out;
  } finally {
    await producer.shutdown();
  }
}

async function consume(step) {
  const consumer = new SimpleConsumer({ endpoints, sessionCredentials, consumerGroup: step.group,
    subscriptions: new Map().set(step.topic, '*'), awaitDuration: 2000, requestTimeout: 5000 });
  await consumer.startup();
  try {
    const got = [];
    for (let round = 0; round < 20 && got.length < step.want; round++) {
      for (const message of await consumer.receive(Math.min(32, step.want - got.length), 20000)) {
        got.push({ id: message.messageId, body: message.body.toString() });
        await consumer.ack(message);
      }
    }
    return got;
  } finally {
    await consumer.shutdown();
  }
}

async function main() {
  const results = [];
  for (const step of JSON.parse(stepsJson)) {
    try {
      results.push(await (step.op === 'produce' ? produce(step) : consume(step)));
    } catch (error) {
      // A refused route query fails the client's startup; the client's exception is the cause.
      let found = error;
      while (found.code === undefined && found.cause) found = found.cause;
      results.push({ error: found.constructor.name, code: found.code ?? null, message: String(error.message) });
    }
  }
  process.stdout.write(JSON.stringify(results) + '\n');
  process.exit(0);
}

main().catch((error) => { console.error(error); process.exit(1); });
