/**
 * How much of an agent's edit survives in a document, as `PersistenceCheck` reports it.
 *
 * Texts are compared as multisets of character 4-grams (every run of 4 consecutive UTF-16 code
 * units; `\r\n` and `\r` count as `\n`). Let I be the inserted text, D the document now, B the
 * document before the edit and A the document right after it; `n(X, g)` is how often 4-gram g
 * occurs in X.
 *
 * - `survival_score`: the fraction of I's 4-grams still found in D, each occurrence in D matching
 *   at most one occurrence in I (I's 4-grams taken in order). Text shorter than 4 characters
 *   scores 1 when it occurs in D as a substring, else 0; empty text scores 1 (nothing inserted,
 *   nothing lost).
 * - `surviving_chars`: the characters of I (line endings normalised) covered by at least one
 *   matched 4-gram (all of a short text found as a substring; 0 for empty text). An estimate: a
 *   4-gram may match text that was elsewhere in the document already.
 * - `unchanged`: `survival_score >= 0.95`.
 * - `revert_score`: the fraction of the edit's 4-gram changes that D has undone. The edit removed
 *   R(g) = max(0, n(B, g) − n(A, g)) and added S(g) = max(0, n(A, g) − n(B, g)) of each g; D has
 *   restored min(R(g), max(0, n(D, g) − n(A, g))) and taken back min(S(g), max(0, n(A, g) − n(D, g))).
 *   revert_score = (restored + taken back) / Σ (R(g) + S(g)). 0 when D = A, 1 when D has B's
 *   4-grams where the edit changed them (D = B, or an undo); edits elsewhere in the document do
 *   not count. 0 when B or A is unknown, or the edit changed no 4-gram.
 *
 * Contract: pure functions, linear in the lengths of the texts.
 */

export const GRAM = 4;
/** `unchanged` holds from this survival score up. */
export const UNCHANGED_AT = 0.95;

export interface SurvivalScores {
  survival_score: number;
  revert_score: number;
  unchanged: boolean;
  surviving_chars: number;
}

type Counts = Map<string, number>;

function normalize(text: string): string {
  return text.replace(/\r\n?/g, "\n");
}

/** The 4-gram counts of `text`, only of the 4-grams in `only` when given. */
function gramCounts(text: string, only?: { has(gram: string): boolean }): Counts {
  const counts: Counts = new Map();
  for (let i = 0; i + GRAM <= text.length; i++) {
    const gram = text.substring(i, i + GRAM);
    if (only === undefined || only.has(gram)) {
      counts.set(gram, (counts.get(gram) ?? 0) + 1);
    }
  }
  return counts;
}

/** `survival_score` and `surviving_chars` of `inserted` in `document` (see the module doc). */
export function survival(inserted: string, document: string): { score: number; survivingChars: number } {
  const text = normalize(inserted);
  const doc = normalize(document);
  if (text.length === 0) {
    return { score: 1, survivingChars: 0 };
  }
  if (text.length < GRAM) {
    return doc.includes(text) ? { score: 1, survivingChars: text.length } : { score: 0, survivingChars: 0 };
  }
  const available = gramCounts(doc, gramCounts(text));
  const covered = new Uint8Array(text.length);
  const total = text.length - GRAM + 1;
  let matched = 0;
  for (let i = 0; i < total; i++) {
    const gram = text.substring(i, i + GRAM);
    const left = available.get(gram) ?? 0;
    if (left > 0) {
      available.set(gram, left - 1);
      matched += 1;
      covered.fill(1, i, i + GRAM);
    }
  }
  return { score: matched / total, survivingChars: covered.reduce((sum, c) => sum + c, 0) };
}

/** What an edit changed, as 4-gram counts: computed once per edit, compared with each later document. */
export interface EditDelta {
  /** R(g): occurrences the edit removed. */
  readonly removed: ReadonlyMap<string, number>;
  /** S(g): occurrences the edit added. */
  readonly added: ReadonlyMap<string, number>;
  /** n(A, g) of every g in `removed` or `added`. */
  readonly after: ReadonlyMap<string, number>;
  /** Σ (R(g) + S(g)). */
  readonly total: number;
}

/** The 4-gram changes of an edit that turned `before` into `after`. */
export function editDelta(before: string, after: string): EditDelta {
  const b = gramCounts(normalize(before));
  const a = gramCounts(normalize(after));
  const removed: Counts = new Map();
  const added: Counts = new Map();
  let total = 0;
  for (const [gram, n] of b) {
    const d = n - (a.get(gram) ?? 0);
    if (d > 0) {
      removed.set(gram, d);
      total += d;
    }
  }
  for (const [gram, n] of a) {
    const d = n - (b.get(gram) ?? 0);
    if (d > 0) {
      added.set(gram, d);
      total += d;
    }
  }
  const changed = new Map([...removed, ...added]);
  const afterCounts: Counts = new Map([...changed.keys()].map((g) => [g, a.get(g) ?? 0]));
  return { removed, added, after: afterCounts, total };
}

/** `revert_score` of `document` for the edit `delta` describes (see the module doc). */
export function revertScore(delta: EditDelta, document: string): number {
  if (delta.total === 0) {
    return 0;
  }
  const now = gramCounts(normalize(document), delta.after);
  let undone = 0;
  for (const [gram, r] of delta.removed) {
    undone += Math.min(r, Math.max(0, (now.get(gram) ?? 0) - (delta.after.get(gram) ?? 0)));
  }
  for (const [gram, s] of delta.added) {
    undone += Math.min(s, Math.max(0, (delta.after.get(gram) ?? 0) - (now.get(gram) ?? 0)));
  }
  return undone / delta.total;
}

/** Every score of one check; `delta` null when the text before (or after) the edit is unknown. */
export function scoreEdit(insertedText: string, delta: EditDelta | null, document: string): SurvivalScores {
  const { score, survivingChars } = survival(insertedText, document);
  return {
    survival_score: score,
    revert_score: delta === null ? 0 : revertScore(delta, document),
    unchanged: score >= UNCHANGED_AT,
    surviving_chars: survivingChars,
  };
}
