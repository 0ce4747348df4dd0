-- Operator actions report their execution (SPEC §6): every request has an id (the UID of its
-- SequentialInboxAction) and a row here; the consumer that executes it writes the outcome in the
-- transaction that clears the pending action, so the operator can tell Executed from Failed.

CREATE TABLE operator_action (
  request_id text PRIMARY KEY,
  action text NOT NULL,
  target text NOT NULL,
  requested_at timestamptz NOT NULL DEFAULT now(),
  executed_at timestamptz,
  -- NULL while pending; Executed, Failed (the action ran and could not do its work) or
  -- Superseded (another request replaced it on the same target before it ran).
  outcome text CHECK (outcome IN ('Executed','Failed','Superseded')),
  detail text
);

ALTER TABLE sequenced_message ADD COLUMN pending_action_id text;
ALTER TABLE sequence_instance ADD COLUMN pending_action_id text;
