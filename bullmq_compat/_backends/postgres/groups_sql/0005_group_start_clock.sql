-- bullmq-compat's per-group gate on PostgreSQL, version 5: a group job's start is stamped on the
-- database's clock (docs/groups.md, "Group rate limits").
--
-- A start's processed_at_ms is what the caller of upstream's move_to_active (or of a fused
-- finish-and-fetch) passed as its "now": the client's clock when it sent the call. Version 4 decides
-- a rate-limited group's next release on the database's clock and reads the window's starts from
-- processed_at_ms, so a call that reached the database late (a loaded machine) could start a job the
-- database had released on time and still record it inside the window of an earlier start (seen in a
-- fresh-clone run under Node workers: three starts of a group within 683 ms, limit 2 per 700 ms).
-- From this version the BEFORE UPDATE trigger stamps a group job's start with GREATEST(the
-- caller's now, the database's clock): the starts the gate counts and the starts Node and
-- Bull-Board read are then the same, and the window holds on
-- them. Plain jobs are untouched (the trigger's WHEN excludes them).
--
-- Upgrading a version-4 schema replaces bullmq_compat_gate_update in place (same signature; the
-- trigger and the jobs are left as they are).

CREATE OR REPLACE FUNCTION bullmq_compat_gate_update() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_gid text := bullmq_compat_gid(NEW.opts);
  v_parent_gid text;
  v_set record;
BEGIN
  IF v_gid IS NULL OR pg_trigger_depth() > 1 THEN
    RETURN NEW; -- not a group job, or our own release (a statement run by a trigger of ours)
  END IF;
  IF NEW.state = 'active' THEN
    -- a start (upstream's move_to_active or a fused finish-and-fetch; our take_group_jobs): its
    -- processed_at_ms is the caller's clock when it sent the call, which a busy client or server can
    -- make tens of ms older than the moment the database runs it; the rate limit's window is kept on
    -- the database's clock, so the start is stamped no earlier than that moment
    IF OLD.state <> 'active' AND NEW.processed_at_ms IS NOT NULL THEN
      NEW.processed_at_ms := GREATEST(NEW.processed_at_ms, (extract(epoch FROM clock_timestamp()) * 1000)::bigint);
    END IF;
    RETURN NEW; -- (not an arrival, not the end of a turn)
  END IF;
  IF OLD.state IN ('waiting', 'active', 'delayed') AND NEW.state IN ('completed', 'failed', 'waiting-children') THEN
    -- a released job whose turn ends: the group's next job goes (this one is still counted)
    IF NEW.parent_id IS NOT NULL THEN
      -- upstream may move its parent in this transaction: a parent of a group that comes first is
      -- locked first, so that its lock is not taken out of order then
      SELECT bullmq_compat_gid(opts) INTO v_parent_gid FROM job WHERE queue = NEW.parent_queue AND id = NEW.parent_id;
      IF v_parent_gid IS NOT NULL
         AND (NEW.parent_queue || chr(1) || v_parent_gid) COLLATE "C" < (NEW.queue || chr(1) || v_gid) COLLATE "C" THEN
        PERFORM bullmq_compat_lock_group(NEW.parent_queue, v_parent_gid);
      END IF;
    END IF;
    PERFORM bullmq_compat_lock_group(NEW.queue, v_gid);
    PERFORM bullmq_compat_release_locked(NEW.queue, v_gid, (extract(epoch FROM clock_timestamp()) * 1000)::bigint, 1);
    RETURN NEW;
  END IF;
  IF OLD.state NOT IN ('completed', 'failed', 'waiting-children') OR NEW.state NOT IN ('waiting', 'delayed') THEN
    RETURN NEW; -- not an arrival
  END IF;
  PERFORM bullmq_compat_lock_group(NEW.queue, v_gid);
  SELECT * INTO v_set FROM bullmq_compat_group_settings(NEW.queue, v_gid);
  -- (its place among equal orders is its seq before the move: our own release, from an API function,
  -- gives the job a fresh one, and passes here as the group's head)
  IF bullmq_compat_may_pass(NEW.queue, v_gid, bullmq_compat_group_order(NEW.opts, NEW.added_at_ms), OLD.seq,
                            false, 0, v_set.paused, v_set.concurrency) THEN
    RETURN NEW;
  END IF;
  NEW.state := 'waiting-children';
  NEW.process_at_ms := NULL;
  PERFORM bullmq_compat_note_gated(NEW.queue, NEW.id);
  RETURN NEW;
END;
$$;
