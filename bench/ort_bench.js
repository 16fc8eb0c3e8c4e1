// ONNX Runtime (onnxruntime-node, CPU) on one model with all of its real inputs.
//
//   NODE_PATH=DIR/node_modules node bench/ort_bench.js MODEL_DIR|model.onnx [--threads 2] [--iters 30]
//        [--warmup 5] [--data DIR] [--profile PREFIX]
//
// Every graph input is read, with its own dtype and shape, from DIR/input_N.pb (default: the model folder's
// test_data_set_0/); the outputs are compared with DIR/output_N.pb and the max abs error is printed.
// Intra-op threads = --threads, inter-op threads 1, sequential execution, all graph optimizations.
// Prints one JSON line: create_ms (session creation), median/p10/p90/min run time in ms, max_abs_err.
// --serve: after the check and the warm-up, print {"ready": true, "create_ms", "max_abs_err"}, then for each
// line N on stdin time N runs and print {"ms": [...]} (bench/paired.py alternates it call by call with tessel).
// --profile PREFIX turns on ORT's own profiler (per-node times of every run, a Chrome trace written to
// PREFIX_<date>.json, named as profile_file in the JSON line); bench/ort_profile_table.py sums it per node.
'use strict';
const fs = require('fs');
const path = require('path');

let ort;
try {
  ort = require('onnxruntime-node');
} catch (e) {
  console.log(JSON.stringify({ error: 'onnxruntime-node not found (set NODE_PATH=DIR/node_modules): ' + e.message }));
  process.exit(3);
}

// ---- a minimal protobuf reader for onnx.TensorProto
class Reader {
  constructor(buf) { this.b = buf; this.p = 0; }
  eof() { return this.p >= this.b.length; }
  varint() {  // as BigInt (int64 fields may be negative: 10-byte two's complement)
    let r = 0n, s = 0n;
    for (;;) {
      const c = this.b[this.p++];
      r |= BigInt(c & 0x7f) << s;
      if (!(c & 0x80)) return r;
      s += 7n;
    }
  }
  bytes() { const n = Number(this.varint()); const v = this.b.subarray(this.p, this.p + n); this.p += n; return v; }
  skip(wt) {
    if (wt === 0) this.varint();
    else if (wt === 1) this.p += 8;
    else if (wt === 2) this.bytes();
    else if (wt === 5) this.p += 4;
    else throw new Error('unsupported protobuf wire type ' + wt);
  }
}

// onnx TensorProto.DataType -> [ort type name, typed array, raw bytes per element]
const DT = {
  1: ['float32', Float32Array, 4], 2: ['uint8', Uint8Array, 1], 3: ['int8', Int8Array, 1],
  4: ['uint16', Uint16Array, 2], 5: ['int16', Int16Array, 2], 6: ['int32', Int32Array, 4],
  7: ['int64', BigInt64Array, 8], 9: ['bool', Uint8Array, 1], 10: ['float16', Uint16Array, 2],
  11: ['float64', Float64Array, 8], 12: ['uint32', Uint32Array, 4], 13: ['uint64', BigUint64Array, 8],
};

function readTensorProto(file) {
  const r = new Reader(fs.readFileSync(file));
  const t = { dims: [], dataType: 0, name: '', raw: null, vals: [] };
  while (!r.eof()) {
    const key = Number(r.varint()), field = key >> 3, wt = key & 7;
    if (field === 1) {  // dims: int64, packed or not
      if (wt === 2) { const s = new Reader(r.bytes()); while (!s.eof()) t.dims.push(Number(BigInt.asIntN(64, s.varint()))); }
      else t.dims.push(Number(BigInt.asIntN(64, r.varint())));
    } else if (field === 2) t.dataType = Number(r.varint());
    else if (field === 8) t.name = Buffer.from(r.bytes()).toString('utf8');
    else if (field === 9) t.raw = r.bytes();
    else if (field === 4 || field === 10) {  // float_data (fixed32) / double_data (fixed64)
      const w = field === 4 ? 4 : 8;
      const chunk = wt === 2 ? r.bytes() : r.b.subarray(r.p, (r.p += w));
      const dv = new DataView(chunk.buffer, chunk.byteOffset, chunk.byteLength);
      for (let o = 0; o < chunk.length; o += w) t.vals.push(w === 4 ? dv.getFloat32(o, true) : dv.getFloat64(o, true));
    } else if (field === 5 || field === 7 || field === 11) {  // int32_data / int64_data / uint64_data (varints)
      if (wt === 2) { const s = new Reader(r.bytes()); while (!s.eof()) t.vals.push(s.varint()); }
      else t.vals.push(r.varint());
    } else if (field === 13 || (field === 14 && wt === 0 && r.b[r.p] === 1)) {
      throw new Error(file + ': external data is not supported');
    } else r.skip(wt);
  }
  const dt = DT[t.dataType];
  if (!dt) throw new Error(`${file}: unsupported TensorProto data_type ${t.dataType}`);
  const [typeName, Arr, size] = dt;
  const n = t.dims.reduce((a, b) => a * b, 1);
  let data;
  if (t.raw) {
    if (t.raw.length !== n * size) throw new Error(`${file}: raw_data has ${t.raw.length} bytes, expected ${n * size}`);
    const ab = new ArrayBuffer(n * size);  // aligned copy
    new Uint8Array(ab).set(t.raw);
    data = new Arr(ab);
  } else {
    data = new Arr(n);
    for (let i = 0; i < n; i++) {
      const v = t.vals[i];
      if (Arr === BigInt64Array) data[i] = BigInt.asIntN(64, v);
      else if (Arr === BigUint64Array) data[i] = BigInt.asUintN(64, v);
      else if (typeof v === 'bigint') data[i] = Number(BigInt.asIntN(32, v));  // int32_data also holds the small types
      else data[i] = v;
    }
  }
  return { name: t.name, type: typeName, dims: t.dims, data };
}

function maxAbsErr(got, want) {
  if (got.dims.length !== want.dims.length || got.dims.some((d, i) => d !== want.dims[i])) return Infinity;
  const a = got.data, b = want.data;
  let e = 0;
  for (let i = 0; i < b.length; i++) {
    const d = Math.abs(Number(a[i]) - Number(b[i]));
    if (d > e || Number.isNaN(d)) e = Number.isNaN(d) ? (Number.isNaN(Number(a[i])) && Number.isNaN(Number(b[i])) ? e : Infinity) : d;
  }
  return e;
}

async function serve(s, feeds, ready) {
  console.log(JSON.stringify(Object.assign({ ready: true }, ready)));
  const rl = require('readline').createInterface({ input: process.stdin, terminal: false });
  for await (const line of rl) {
    const n = Number(line.trim());
    if (!Number.isInteger(n) || n < 1 || n > 100000) {
      console.log(JSON.stringify({ error: `expected a count of runs in 1..100000, got '${line.slice(0, 40)}'` }));
      continue;
    }
    const ms = [];
    for (let i = 0; i < n; i++) {
      const t = process.hrtime.bigint();
      await s.run(feeds);
      ms.push(Number(process.hrtime.bigint() - t) / 1e6);
    }
    console.log(JSON.stringify({ ms }));
  }
}

async function main() {
  const argv = process.argv.slice(2);
  const opt = { threads: 2, iters: 30, warmup: 5, data: null, profile: null, serve: false };
  let model = null;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--threads') opt.threads = Number(argv[++i]);
    else if (a === '--iters') opt.iters = Number(argv[++i]);
    else if (a === '--warmup') opt.warmup = Number(argv[++i]);
    else if (a === '--data') opt.data = argv[++i];
    else if (a === '--profile') opt.profile = argv[++i];
    else if (a === '--serve') opt.serve = true;
    else if (a === '-h' || a === '--help') { console.log(fs.readFileSync(__filename, 'utf8').split('\n').slice(0, 9).join('\n')); return; }
    else model = a;
  }
  if (!model) throw new Error('usage: ort_bench.js MODEL_DIR|model.onnx [--threads T] [--iters N] [--warmup W] [--data DIR]');
  const isDir = fs.statSync(model).isDirectory();
  const onnxFile = isDir ? path.join(model, 'model.onnx') : model;
  const dataDir = opt.data || path.join(isDir ? model : path.dirname(model), 'test_data_set_0');

  const so = {
    intraOpNumThreads: opt.threads, interOpNumThreads: 1, executionMode: 'sequential',
    executionProviders: ['cpu'], graphOptimizationLevel: 'all',
  };
  if (opt.profile) { so.enableProfiling = true; so.profileFilePrefix = opt.profile; }
  let t = process.hrtime.bigint();
  const s = await ort.InferenceSession.create(onnxFile, so);
  const createMs = Number(process.hrtime.bigint() - t) / 1e6;

  const feeds = {}, inputs = [];
  s.inputNames.forEach((name, k) => {
    const tp = readTensorProto(path.join(dataDir, `input_${k}.pb`));
    const key = s.inputNames.includes(tp.name) ? tp.name : name;
    feeds[key] = new ort.Tensor(tp.type, tp.data, tp.dims);
    inputs.push({ name: key, type: tp.type, dims: tp.dims });
  });
  const expected = [];
  for (let k = 0; fs.existsSync(path.join(dataDir, `output_${k}.pb`)); k++) expected.push(readTensorProto(path.join(dataDir, `output_${k}.pb`)));

  const first = await s.run(feeds);
  let err = 0;
  expected.forEach((want, k) => {
    const name = s.outputNames.includes(want.name) ? want.name : s.outputNames[k];
    err = Math.max(err, maxAbsErr(first[name], want));
  });
  for (let i = 0; i < opt.warmup; i++) await s.run(feeds);
  if (opt.serve) return serve(s, feeds, { create_ms: createMs, max_abs_err: expected.length ? err : null, threads: opt.threads });
  const ts = [];
  for (let i = 0; i < opt.iters; i++) {
    t = process.hrtime.bigint();
    await s.run(feeds);
    ts.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  let profileFile = null;
  if (opt.profile) profileFile = s.endProfiling ? s.endProfiling() : null;
  ts.sort((a, b) => a - b);
  const q = (p) => ts[Math.min(ts.length - 1, Math.floor(p * ts.length))];
  let version = null;
  try { version = require('onnxruntime-node/package.json').version; } catch (e) { /* older packages hide it */ }
  console.log(JSON.stringify({
    model, ort_version: version, threads: opt.threads, inter_op_threads: 1, inputs,
    create_ms: createMs, median_ms: ts[ts.length >> 1], p10_ms: q(0.1), p90_ms: q(0.9), min_ms: ts[0],
    iters: opt.iters, max_abs_err: expected.length ? err : null, profile_file: profileFile,
  }));
}

main().catch((e) => { console.log(JSON.stringify({ error: String(e && e.message || e) })); process.exit(2); });
