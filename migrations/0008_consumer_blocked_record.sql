-- A record retried for long is visible (SPEC §7): every heartbeat writes the record the consumer
-- has retried longest after infrastructure errors (all NULL while none is), and the operator reads
-- it through `seqinbox migrate --dry-run` for the inbox's Degraded condition. blocked_since is a
-- time of the database clock, like heartbeat_at.

ALTER TABLE consumer_registry
  ADD COLUMN blocked_topic text,
  ADD COLUMN blocked_partition integer,
  ADD COLUMN blocked_offset bigint,
  ADD COLUMN blocked_since timestamptz,
  ADD COLUMN blocked_error text;
