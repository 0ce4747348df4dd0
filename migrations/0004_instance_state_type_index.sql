-- The release and skip checks read an instance's PROCESSED types and its WAITING messages.
-- With message_type in the index those reads are index-only and do not grow with the number of
-- messages in the instance.
CREATE INDEX sequenced_message_instance_state_type
  ON sequenced_message (sequence_instance_id, state, message_type);
DROP INDEX sequenced_message_instance_state;
