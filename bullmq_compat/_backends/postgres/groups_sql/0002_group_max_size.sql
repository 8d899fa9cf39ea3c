-- bullmq-compat's per-group gate on PostgreSQL, version 2: max group size (BullMQ Pro's
-- group.maxSize; docs/groups.md, "Max group size").
--
-- A group job whose opts hold {"group": {"id": <gid>, "maxSize": n}} is refused when its group
-- already holds n jobs not started yet: held ('waiting-children') or released and not taken by a
-- worker ('waiting', 'delayed': a retry's backoff too). Active and finished jobs do not count. The
-- decision is taken in our BEFORE INSERT trigger, under the group's gate lock (as the gate's own
-- decision), so concurrent producers -- Python or Node, whoever calls upstream's add_job or
-- add_jobs_bulk -- never overshoot; the refusal is an error (SQLSTATE BQG01, DETAIL a JSON object
-- {"queue", "group", "maxSize"}), so upstream's whole call is rolled back: nothing is written (an
-- add_bulk's other jobs neither). bullmq-compat raises it as GroupMaxSizeExceeded.
--
-- Upgrading a version-1 schema replaces bullmq_compat_gate_insert() in place (the trigger itself,
-- and every job, are left as they are).

-- A job's maxSize (opts.group.maxSize), NULL when it gave none (or not a number >= 1).
CREATE FUNCTION bullmq_compat_max_size(p_opts jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT CASE WHEN jsonb_typeof(p_opts -> 'group' -> 'maxSize') = 'number'
                   AND (p_opts -> 'group' ->> 'maxSize')::numeric >= 1
              THEN LEAST(floor((p_opts -> 'group' ->> 'maxSize')::numeric), 9e15)::bigint END
$$;

-- Does group p_gid of p_queue hold at least p_limit jobs not started yet? (two index scans, each
-- stopping at p_limit rows: held jobs by bullmq_compat_group_held_idx, released ones not active by
-- bullmq_compat_group_running_idx). The caller holds the group lock.
CREATE FUNCTION bullmq_compat_group_is_full(p_queue text, p_gid text, p_limit bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_n bigint;
BEGIN
  SELECT count(*) INTO v_n FROM (
    SELECT 1 FROM job
     WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = p_gid AND state = 'waiting-children'
     LIMIT p_limit) AS held;
  IF v_n >= p_limit THEN
    RETURN true;
  END IF;
  SELECT v_n + count(*) INTO v_n FROM (
    SELECT 1 FROM job
     WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = p_gid AND state IN ('waiting', 'delayed')
     LIMIT p_limit - v_n) AS released;
  RETURN v_n >= p_limit;
END;
$$;

-- BEFORE INSERT: a new group job (version 1's, with the max size check under the group lock).
CREATE OR REPLACE FUNCTION bullmq_compat_gate_insert() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_gid text := bullmq_compat_gid(NEW.opts);
  v_set record;
  v_order bigint;
  v_due bigint;
  v_max bigint;
BEGIN
  IF v_gid IS NULL OR NEW.state NOT IN ('waiting', 'delayed') THEN
    RETURN NEW; -- not a group job, or a flow parent (refused by the clients; left to upstream)
  END IF;
  PERFORM bullmq_compat_lock_group(NEW.queue, v_gid);
  -- upstream's add is INSERT ... ON CONFLICT DO NOTHING, and a BEFORE trigger fires before the
  -- conflict is found: an id that exists will not be inserted, so the gate must change nothing
  -- (checked under the lock: a concurrent add of the id has committed by now)
  IF EXISTS (SELECT 1 FROM job WHERE queue = NEW.queue AND id = NEW.id) THEN
    RETURN NEW;
  END IF;
  v_max := bullmq_compat_max_size(NEW.opts);
  IF v_max IS NOT NULL AND bullmq_compat_group_is_full(NEW.queue, v_gid, v_max) THEN
    RAISE EXCEPTION 'bullmq-compat: group % of queue % already holds maxSize=% jobs not started yet: the job was not added',
                    quote_literal(v_gid), quote_literal(NEW.queue), v_max
      USING ERRCODE = 'BQG01',
            DETAIL = jsonb_build_object('queue', NEW.queue, 'group', v_gid, 'maxSize', v_max)::text,
            HINT = 'the group counts its held jobs and its released jobs not yet active; retry once it has run some';
  END IF;
  SELECT * INTO v_set FROM bullmq_compat_group_settings(NEW.queue, v_gid);
  v_order := bullmq_compat_group_order(NEW.opts, NEW.added_at_ms);
  IF NOT bullmq_compat_may_pass(NEW.queue, v_gid, v_order, NEW.seq, bullmq_compat_order_ms(NEW.opts) IS NOT NULL,
                                v_set.ordering_delay_ms, v_set.paused, v_set.concurrency) THEN
    NEW.state := 'waiting-children';
    NEW.process_at_ms := NULL;
    PERFORM bullmq_compat_note_gated(NEW.queue, NEW.id);
    RETURN NEW;
  END IF;
  v_due := bullmq_compat_due(NEW.opts, NEW.added_at_ms, NEW.delay_ms, v_set.ordering_delay_ms);
  IF v_due > bullmq_compat_now() AND v_due > COALESCE(NEW.process_at_ms, 0) THEN
    NEW.state := 'delayed'; -- its ordering window
    NEW.process_at_ms := v_due;
    PERFORM bullmq_compat_note_gated(NEW.queue, NEW.id);
  END IF;
  RETURN NEW;
END;
$$;
