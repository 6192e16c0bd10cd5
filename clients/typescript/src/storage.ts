/**
 * Where the client keeps its offline queue across restarts.
 *
 * The client calls `load()` once, when it is constructed, and `save()` with the whole queue as one
 * string whenever the queue should outlive the process (delivery failing, flush, dispose). Saves
 * never overlap: the next one starts after the previous one settled. An adapter that throws or
 * rejects is reported through the client's `onError` (kind `"storage"`); the events stay in memory.
 *
 * Adapters: {@link MemoryStorage} here; `FileStorage` (Node only) in `@rewardflow/client/file-storage`.
 * In a VS Code extension, `context.globalState` works too:
 * `{ load: async () => state.get("rewardflow.queue") ?? null, save: (d) => state.update("rewardflow.queue", d) }`.
 *
 * One adapter (one file, one key) per client instance: two clients sharing one would overwrite
 * each other's queue.
 */
export interface StorageAdapter {
  /** The string last saved, or null when there is none. */
  load(): Promise<string | null>;
  /** Replace the stored string with `data`. Resolves once it is stored. */
  save(data: string): Promise<void>;
}

/** Keeps the queue in memory: survives a new client in the same process (tests, a reloaded module), not a restart. */
export class MemoryStorage implements StorageAdapter {
  data: string | null;

  constructor(data: string | null = null) {
    this.data = data;
  }

  async load(): Promise<string | null> {
    return this.data;
  }

  async save(data: string): Promise<void> {
    this.data = data;
  }
}
