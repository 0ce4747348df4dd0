-- A raw record (buffered_message) is found, replaced and deleted by its message alone, and goes
-- with its message: every statement of this and of earlier versions names sequenced_message_id,
-- and the cascade from sequence_instance reaches the records through sequenced_message. So the
-- record is keyed by its message: the unique index of sequenced_message_id becomes the primary
-- key (ON CONFLICT (sequenced_message_id) of earlier versions still finds it), and the index of
-- the surrogate id, the foreign key to sequence_instance and its index go. A buffered message
-- then pays for one index entry and one foreign-key check instead of three and two. The id and
-- sequence_instance_id columns stay, filled as before, for the consumers of earlier versions that
-- run during a rollout. Building the key reads the table once under a lock that blocks its
-- writes for that time (seconds per million records).
ALTER TABLE buffered_message DROP CONSTRAINT buffered_message_sequence_instance_id_fkey;
DROP INDEX buffered_message_sequence_instance_id;
ALTER TABLE buffered_message
  DROP CONSTRAINT buffered_message_pkey,
  DROP CONSTRAINT buffered_message_sequenced_message_id_key,
  ADD CONSTRAINT buffered_message_pkey PRIMARY KEY (sequenced_message_id);
