/**
 * A file-backed {@link StorageAdapter} for Node.js (and the VS Code extension host), imported from
 * `@rewardflow/client/file-storage`. This is the only module of the client that uses Node's APIs.
 *
 * Contract: `save()` writes a temporary file beside the target and renames it over the target, so
 * a crash mid-save leaves the previous queue, never half of one; missing directories are created.
 * `load()` answers null when the file does not exist and rejects on any other read error.
 */
import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import { dirname } from "node:path";

import type { StorageAdapter } from "./storage";

let saves = 0;

export class FileStorage implements StorageAdapter {
  /** `path`: the file holding the queue, e.g. `path.join(context.globalStorageUri.fsPath, "queue.json")`. */
  constructor(readonly path: string) {}

  async load(): Promise<string | null> {
    try {
      return await readFile(this.path, "utf8");
    } catch (error) {
      if ((error as { code?: unknown }).code === "ENOENT") {
        return null;
      }
      throw error;
    }
  }

  async save(data: string): Promise<void> {
    await mkdir(dirname(this.path), { recursive: true });
    const temporary = `${this.path}.${process.pid}.${++saves}.tmp`;
    await writeFile(temporary, data, "utf8");
    await rename(temporary, this.path);
  }
}
