-- The inbox that owns these tables (SPEC §6: one inbox per set of tables). Housekeeping and
-- operator actions act on every row they can see, so two inboxes on the same tables would run
-- each other's: `seqinbox migrate --inbox` and the consumers record the first inbox here and
-- refuse any other. At most one row.

CREATE TABLE seqinbox_owner (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  inbox text NOT NULL,
  claimed_at timestamptz NOT NULL DEFAULT now()
);
