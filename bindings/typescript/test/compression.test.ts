// testdata/vectors/compression.json: flag byte, bounded zstd and gzip decoding.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Code, TopspinError } from "../src/index.js";
import { decodeMessage, gzipWeb, zstd, type Decoder } from "../src/compression.js";
import { gzip } from "../src/node/index.js";
import { repoRoot } from "./procs.js";

interface Case {
  name: string;
  kind: string;
  encoding: string;
  payload: string;
  limit: number;
  message?: string;
  code?: string;
}
const doc = JSON.parse(readFileSync(join(repoRoot, "testdata", "vectors", "compression.json"), "utf8")) as {
  version: number;
  vectors: Case[];
};
assert.equal(doc.version, 1);
const cases = doc.vectors.filter((v) => v.kind === "compression");
assert.ok(cases.length > 0);

const decoders: Record<string, Decoder[]> = { zstd: [zstd], gzip: [gzip, gzipWeb] };
for (const c of cases) {
  for (const dec of decoders[c.encoding] ?? []) {
    test(`compression ${c.name} (${c.encoding}${dec === gzipWeb ? ", DecompressionStream" : ""})`, async () => {
      const p = decodeMessage(Buffer.from(c.payload, "hex"), dec, c.limit);
      if (c.message !== undefined) {
        assert.equal(Buffer.from(await p).toString("hex"), c.message);
      } else {
        await assert.rejects(p, (e: unknown) => e instanceof TopspinError && Code[e.code] === c.code);
      }
    });
  }
}
