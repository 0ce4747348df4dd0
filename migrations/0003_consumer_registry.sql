-- Consumer registry for the version fence (SPEC §6, §8): every running consumer registers and
-- heartbeats here, so that no consumer processes next to a live one of another claim protocol.

CREATE TABLE consumer_registry (
  instance_id text PRIMARY KEY,
  consumer_group text NOT NULL,
  engine_version text NOT NULL,
  claim_protocol text NOT NULL,
  started_at timestamptz NOT NULL,
  heartbeat_at timestamptz NOT NULL
);

-- Conflict checks: live consumers of one group.
CREATE INDEX consumer_registry_group_heartbeat ON consumer_registry (consumer_group, heartbeat_at);
