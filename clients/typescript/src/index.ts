/**
 * `@rewardflow/client`: send rewardflow events from editor extensions and Node.js to the ingestion
 * edge (`rewardflow collect`). Zero runtime dependencies; web-standard globals only (Node 18+, the
 * VS Code extension host). The Node-only file storage is in `@rewardflow/client/file-storage`.
 */
export * from "./events";
export {
  RewardflowClient,
  type ClientError,
  type ClientOptions,
  type ClientStats,
  type Delivery,
  type EventInput,
  type FlushOptions,
  type RejectedEvent,
  type TrackResult,
} from "./client";
export { MemoryStorage, type StorageAdapter } from "./storage";
export {
  DEFAULT_HORIZONS_S,
  PERSISTENCE_CHECK_NAMESPACE,
  persistenceCheckId,
  trackEditSurvival,
  type EditInfo,
  type EditSurvivalOptions,
  type SurvivalHandle,
  type Timer,
  type Tracker,
} from "./persistence";
export { editDelta, revertScore, scoreEdit, survival, UNCHANGED_AT, type EditDelta, type SurvivalScores } from "./survival";
export { randomEventId, uuid5 } from "./ids";
export { backoffMs, parseRetryAfter, retryDelayMs, type BackoffPolicy } from "./retry";
