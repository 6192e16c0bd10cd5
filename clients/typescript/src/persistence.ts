/**
 * Edit survival: after an agent edit, read the document at each horizon (30 s, 2, 5, 10 and
 * 15 minutes by default) and track a `PersistenceCheck` of how much of the edit is still there.
 * The scores are defined in `./survival`.
 *
 * Horizons count from `edit.editedAt` (default: the call). Each check is tracked on the client
 * when its horizon is due; a horizon already past (a re-run after a restart) is checked at once.
 * Each check's `event_id` is a UUID version 5 of (editId, horizon): running the helper again for
 * the same edit tracks the same ids, and the pipeline keeps the first of each.
 *
 * Reading: `readDocument()` returns the document's whole text now, `""` when the file was
 * deleted (the edit did not survive), or null when the text cannot be read now (closed, remote,
 * unreadable): that horizon is skipped rather than guessed. A read that throws is skipped and
 * passed to `onError`.
 *
 * Revert: `revert_score` compares the document with the one before the edit (`edit.textBefore`)
 * and right after it (`edit.textAfter`, or, when only `textBefore` is given, the document as
 * read at the call: call the helper once the edit is applied). Without `textBefore` it is 0.
 *
 * Contract: never throws after validating its arguments (a bad horizon throws `RangeError` at
 * the call). The schedule lives in memory: it ends with the process or `cancel()`; `done`
 * resolves when every horizon was checked or skipped, or at `cancel()`.
 */
import type { EventInput, TrackResult } from "./client";
import { uuid5 } from "./ids";
import { editDelta, scoreEdit, type EditDelta } from "./survival";

export const DEFAULT_HORIZONS_S: readonly number[] = [30, 120, 300, 600, 900];
/** The namespace of the checks' name-based event ids. */
export const PERSISTENCE_CHECK_NAMESPACE = "4c0aa911-56d4-4b9b-b769-1c5a5472a33b";
const MAX_HORIZON_S = 604_800;

/** The `event_id` of the check of `editId` at `horizonS`: `uuid5(namespace, "<editId>/<horizonS>")`. */
export function persistenceCheckId(editId: string, horizonS: number): string {
  return uuid5(PERSISTENCE_CHECK_NAMESPACE, `${editId}/${horizonS}`);
}

/** What tracks the checks: a `RewardflowClient`, or anything with its `track`. */
export interface Tracker {
  track(event: EventInput): TrackResult;
}

/** Timers: the global ones by default; tests pass a fake. */
export interface Timer {
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export interface EditInfo {
  sessionId: string;
  requestId: string;
  /** The `edit_id` of the edit's `AgentEdit`. */
  editId: string;
  /** The text the agent inserted. */
  insertedText: string;
  /** The whole document before the edit; enables `revert_score`. */
  textBefore?: string;
  /** The whole document right after the edit; read at the call when absent (and textBefore given). */
  textAfter?: string;
  /** When the edit was applied, epoch ms by `clock`. Default: now. */
  editedAt?: number;
}

export interface EditSurvivalOptions {
  client: Tracker;
  edit: EditInfo;
  readDocument: () => Promise<string | null> | string | null;
  /** Seconds after the edit; integers in 1..604800. Default {@link DEFAULT_HORIZONS_S}. */
  horizonsS?: readonly number[];
  /** Epoch ms now. Default `Date.now`. */
  clock?: () => number;
  timer?: Timer;
  /** Told about failed reads and checks the client refused. */
  onError?: (error: unknown) => void;
}

export interface SurvivalHandle {
  /** Stop: no further reads or checks. Idempotent. */
  cancel(): void;
  /** Resolves when every horizon was checked or skipped, or at cancel(). Never rejects. */
  readonly done: Promise<void>;
}

const GLOBAL_TIMER: Timer = {
  setTimeout: (callback, ms) => setTimeout(callback, ms),
  clearTimeout: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout>),
};

export function trackEditSurvival(options: EditSurvivalOptions): SurvivalHandle {
  const horizons = [...new Set(options.horizonsS ?? DEFAULT_HORIZONS_S)].sort((a, b) => a - b);
  for (const h of horizons) {
    if (!Number.isInteger(h) || h < 1 || h > MAX_HORIZON_S) {
      throw new RangeError(`horizonsS: ${h} is not an integer number of seconds in 1..${MAX_HORIZON_S}`);
    }
  }
  const { client, edit } = options;
  const clock = options.clock ?? Date.now;
  const timer = options.timer ?? GLOBAL_TIMER;
  const editedAt = edit.editedAt ?? clock();
  const fail = (error: unknown): void => {
    try {
      options.onError?.(error);
    } catch {
      // the caller's handler failing is not the helper's to handle
    }
  };
  let cancelled = false;
  let pending: { handle: unknown; resolve: (due: boolean) => void } | null = null;

  const wait = (ms: number): Promise<boolean> => new Promise((resolve) => {
    pending = { handle: timer.setTimeout(() => { pending = null; resolve(true); }, ms), resolve };
  });
  const read = async (): Promise<string | null> => {
    try {
      return await options.readDocument();
    } catch (error) {
      fail(error);
      return null;
    }
  };

  const done = (async () => {
    let delta: EditDelta | null = null;
    if (edit.textBefore !== undefined) {
      const after = edit.textAfter ?? await read();
      delta = after === null ? null : editDelta(edit.textBefore, after);
    }
    for (const h of horizons) {
      if (cancelled || !(await wait(Math.max(0, editedAt + h * 1000 - clock())))) {
        return;
      }
      const document = await read();
      if (cancelled) {
        return;
      }
      if (document === null) {
        continue;
      }
      const result = client.track({
        event_type: "PersistenceCheck",
        event_id: persistenceCheckId(edit.editId, h),
        ts: Math.trunc(clock()),
        session_id: edit.sessionId,
        request_id: edit.requestId,
        edit_id: edit.editId,
        horizon_s: h,
        ...scoreEdit(edit.insertedText, delta, document),
      });
      if (!result.ok) {
        fail(result.error);
      }
    }
  })().catch(fail);

  return {
    cancel(): void {
      cancelled = true;
      const current = pending as { handle: unknown; resolve: (due: boolean) => void } | null;
      if (current !== null) {
        pending = null;
        timer.clearTimeout(current.handle);
        current.resolve(false);
      }
    },
    done,
  };
}
