-- bullmq-compat's per-group gate on PostgreSQL, version 6: a leaner release (docs/performance.md,
-- "PostgreSQL groups").
--
-- Version 4's release, run by every group job's finish, released the group's head with an UPDATE
-- and then published its event through upstream's publish_event (an INSERT into event, a lookup of
-- the queue's maxLenEvents, a trim every 256th event, a wake-up of event readers). From this version
-- the UPDATE and the event's INSERT are one statement, the event inserted as publish_event inserts
-- it, with the same wake-up of event readers (publish_event's per-queue try-lock and channel); the
-- trim is left to upstream's own publishes (the finish that runs this publishes 'completed' or
-- 'failed'), which trim all older events whenever they do. The group's settings, its running count
-- and its head are read as before, so that a finish whose group holds nothing costs three cheap
-- statements. A group under a rate limit (its own, the queue's default, or a manual one) is released
-- by version 4's function, kept under the name bullmq_compat_release_rated.
--
-- Upgrading a version-5 schema renames version 4's bullmq_compat_release_locked and creates the new
-- one (same signature; the triggers, which call it by name, and the jobs are left as they are).

ALTER FUNCTION bullmq_compat_release_locked(text, text, bigint, integer) RENAME TO bullmq_compat_release_rated;

-- Release the group's next held jobs while it has free slots; returns how many were released. The
-- caller holds the group lock. (p_leaving: the finishing job, still counted, from the BEFORE UPDATE
-- trigger)
CREATE FUNCTION bullmq_compat_release_locked(p_queue text, p_gid text, p_now bigint, p_leaving integer DEFAULT 0)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
  v_concurrency integer;
  v_paused boolean;
  v_ordering_delay_ms bigint;
  v_rated boolean;
  v_running integer;
  v_job record;
  v_due bigint;
  v_released integer := 0;
  v_misses integer := 0;
BEGIN
  SELECT COALESCE(g.concurrency, q.concurrency, 1), COALESCE(g.paused, false),
         COALESCE(g.ordering_delay_ms, q.ordering_delay_ms, 0),
         g.rate_max IS NOT NULL OR q.rate_max IS NOT NULL OR COALESCE(g.rate_until_ms, 0) > p_now
    INTO v_concurrency, v_paused, v_ordering_delay_ms, v_rated
    FROM (SELECT 1) AS one
    LEFT JOIN bullmq_compat_group g ON g.queue = p_queue AND g.gid = p_gid
    LEFT JOIN bullmq_compat_group_queue q ON q.queue = p_queue;
  IF v_rated THEN
    RETURN bullmq_compat_release_rated(p_queue, p_gid, p_now, p_leaving);
  END IF;
  IF v_paused THEN
    RETURN 0;
  END IF;
  SELECT count(*)::integer - p_leaving INTO v_running FROM job
   WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = p_gid
     AND state IN ('waiting', 'active', 'delayed');
  WHILE v_running < v_concurrency LOOP
    SELECT ctid AS head_ctid, id, opts, added_at_ms, delay_ms INTO v_job FROM job
     WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = p_gid
       AND state = 'waiting-children' AND pending_deps = 0
     ORDER BY bullmq_compat_group_order(opts, added_at_ms), abs(seq)
     LIMIT 1;
    EXIT WHEN NOT FOUND;
    v_due := bullmq_compat_due(v_job.opts, v_job.added_at_ms, v_job.delay_ms, v_ordering_delay_ms);
    -- (the head found by its ctid, as version 1: one someone removed or changed meanwhile is not
    -- moved, and looked for again)
    WITH moved AS (
      UPDATE job SET state = CASE WHEN v_due > p_now THEN 'delayed'::job_state ELSE 'waiting'::job_state END,
                     process_at_ms = CASE WHEN v_due > p_now THEN v_due END,
                     seq = CASE WHEN v_job.opts ->> 'lifo' = 'true' THEN -nextval('job_seq') ELSE nextval('job_seq') END
       WHERE ctid = v_job.head_ctid AND state = 'waiting-children' AND pending_deps = 0
      RETURNING id
    )
    INSERT INTO event (queue, event, data, created_at_ms)
    SELECT p_queue, CASE WHEN v_due > p_now THEN 'delayed' ELSE 'waiting' END,
           CASE WHEN v_due > p_now THEN jsonb_build_object('jobId', moved.id, 'delay', v_due)
                ELSE jsonb_build_object('jobId', moved.id, 'prev', 'waiting-children') END,
           (extract(epoch FROM clock_timestamp()) * 1000)::bigint
      FROM moved;
    IF NOT FOUND THEN -- (the head was removed or changed meanwhile: look again, a few times)
      v_misses := v_misses + 1;
      EXIT WHEN v_misses > 3;
      CONTINUE;
    END IF;
    v_running := v_running + 1;
    v_released := v_released + 1;
  END LOOP;
  IF v_released > 0 THEN
    IF pg_try_advisory_xact_lock(hashtext('bullmq:evnotify:' || p_queue)) THEN
      PERFORM pg_notify('bullmq_events', p_queue);
    END IF;
    IF pg_try_advisory_xact_lock(hashtext('bullmq_compat:jobs-notify:' || p_queue)) THEN
      PERFORM pg_notify('bullmq_jobs', p_queue);
    END IF;
  END IF;
  RETURN v_released;
END;
$$;
