-- Housekeeping leadership as a lease: one row naming the consumer that leads and until when. It is
-- taken, renewed and given up by single statements, and every housekeeping batch locks it in its
-- own transaction, so that leadership needs no session of its own: a session-level advisory lock
-- lands on whatever server connection a pooler in transaction mode picks, and two consumers led at
-- once behind one. Consumers of earlier versions still take the advisory lock; every batch of a
-- newer one also takes the same lock for its transaction, so the two never run at the same time.
CREATE TABLE housekeeping_lease (
  only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  holder text NOT NULL,
  expires_at timestamptz NOT NULL
);
