-- Duplicate protection for the declared time (SPEC §6): closing an instance sets its remove_after
-- to the end of its sequence's duplicate-protection window, and housekeeping deletes a closed
-- instance, with its claims, only once that has passed. Closed instances without a remove_after
-- (closed before this migration, or by an older consumer during a rolling update) are given one
-- by housekeeping: closed_at plus the window the sequence declares.
--
-- The housekeeping indexes follow the state: closed instances by the end of their window (and
-- those still without one, as NULL), open instances past their retention by their removal time.
-- The removal time of open instances is its own index, so that the expired gauge and the
-- deletion of expired instances do not walk the closed instances kept for their duplicates.
DROP INDEX sequence_instance_closed;
DROP INDEX sequence_instance_remove_after;
CREATE INDEX sequence_instance_closed_remove_after ON sequence_instance (remove_after)
  WHERE state = 'CLOSED';
CREATE INDEX sequence_instance_expired_remove_after ON sequence_instance (remove_after)
  WHERE state = 'OPEN' AND remove_after IS NOT NULL;
