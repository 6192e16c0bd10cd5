/**
 * Event ids: random ones for ordinary events, name-based (UUID version 5) ones for events that a
 * re-run must reproduce exactly, so the pipeline's deduplication by `event_id` drops the repeat.
 *
 * Contract: pure and synchronous; uses only web-standard globals (`crypto` when present).
 */

const HEX = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, "0"));

interface WebCrypto {
  randomUUID?: () => string;
  getRandomValues?: (array: Uint8Array) => Uint8Array;
}

/**
 * A random UUID (version 4). Uses `crypto.randomUUID()` where the global `crypto` has it (Node 19+,
 * Node 18 with web crypto exposed, the VS Code extension host), else `crypto.getRandomValues`,
 * else `Math.random` (not cryptographic, but 122 random bits keep ids unique in practice; pass
 * `randomUUID` from `node:crypto` in the client options to avoid it on a bare Node 18).
 */
export function randomEventId(): string {
  const web = (globalThis as { crypto?: WebCrypto }).crypto;
  if (typeof web?.randomUUID === "function") {
    return web.randomUUID();
  }
  const bytes = new Uint8Array(16);
  if (typeof web?.getRandomValues === "function") {
    web.getRandomValues(bytes);
  } else {
    for (let i = 0; i < 16; i++) {
      bytes[i] = Math.floor(Math.random() * 256);
    }
  }
  bytes[6] = (bytes[6]! & 0x0f) | 0x40;
  bytes[8] = (bytes[8]! & 0x3f) | 0x80;
  return format(bytes);
}

/** The UUID version 5 of `name` in `namespace` (RFC 9562): the same as Python's `uuid.uuid5`. */
export function uuid5(namespace: string, name: string): string {
  const ns = parse(namespace);
  const text = new TextEncoder().encode(name);
  const input = new Uint8Array(16 + text.length);
  input.set(ns);
  input.set(text, 16);
  const hash = sha1(input).subarray(0, 16);
  hash[6] = (hash[6]! & 0x0f) | 0x50;
  hash[8] = (hash[8]! & 0x3f) | 0x80;
  return format(hash);
}

function parse(uuid: string): Uint8Array {
  const hex = uuid.replace(/-/g, "");
  if (!/^[0-9a-fA-F]{32}$/.test(hex)) {
    throw new RangeError(`not a UUID: ${uuid}`);
  }
  const out = new Uint8Array(16);
  for (let i = 0; i < 16; i++) {
    out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  }
  return out;
}

function format(b: Uint8Array): string {
  let s = "";
  for (let i = 0; i < 16; i++) {
    s += HEX[b[i]!]!;
    if (i === 3 || i === 5 || i === 7 || i === 9) {
      s += "-";
    }
  }
  return s;
}

/** SHA-1 of `data` (20 bytes): only for name-based UUIDs, never for security. */
export function sha1(data: Uint8Array): Uint8Array {
  const bitLength = data.length * 8;
  const padded = new Uint8Array(((data.length + 8) >> 6) * 64 + 64);
  padded.set(data);
  padded[data.length] = 0x80;
  const view = new DataView(padded.buffer);
  view.setUint32(padded.length - 8, Math.floor(bitLength / 0x100000000));
  view.setUint32(padded.length - 4, bitLength >>> 0);
  let h0 = 0x67452301, h1 = 0xefcdab89, h2 = 0x98badcfe, h3 = 0x10325476, h4 = 0xc3d2e1f0;
  const w = new Uint32Array(80);
  for (let offset = 0; offset < padded.length; offset += 64) {
    for (let i = 0; i < 16; i++) {
      w[i] = view.getUint32(offset + 4 * i);
    }
    for (let i = 16; i < 80; i++) {
      const x = w[i - 3]! ^ w[i - 8]! ^ w[i - 14]! ^ w[i - 16]!;
      w[i] = (x << 1) | (x >>> 31);
    }
    let a = h0, b = h1, c = h2, d = h3, e = h4;
    for (let i = 0; i < 80; i++) {
      let f: number, k: number;
      if (i < 20) {
        f = (b & c) | (~b & d);
        k = 0x5a827999;
      } else if (i < 40) {
        f = b ^ c ^ d;
        k = 0x6ed9eba1;
      } else if (i < 60) {
        f = (b & c) | (b & d) | (c & d);
        k = 0x8f1bbcdc;
      } else {
        f = b ^ c ^ d;
        k = 0xca62c1d6;
      }
      const t = (((a << 5) | (a >>> 27)) + f + e + k + w[i]!) >>> 0;
      e = d;
      d = c;
      c = (b << 30) | (b >>> 2);
      b = a;
      a = t;
    }
    h0 = (h0 + a) >>> 0;
    h1 = (h1 + b) >>> 0;
    h2 = (h2 + c) >>> 0;
    h3 = (h3 + d) >>> 0;
    h4 = (h4 + e) >>> 0;
  }
  const out = new Uint8Array(20);
  const outView = new DataView(out.buffer);
  [h0, h1, h2, h3, h4].forEach((h, i) => outView.setUint32(4 * i, h));
  return out;
}
