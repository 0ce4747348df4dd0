-- The gauges count WAITING messages by type; no statement reads the messages of other states by
-- type across instances. The index of (state, message_type) gave every message an entry for as
-- long as its instance is kept; the partial index holds the WAITING ones alone, so a delivered
-- message pays for no entry in it. Building it reads the table once under a lock that blocks
-- writes for that time (seconds per million messages).
CREATE INDEX sequenced_message_waiting_type ON sequenced_message (message_type) WHERE state = 'WAITING';
DROP INDEX sequenced_message_state_message_type;
