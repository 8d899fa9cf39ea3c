-- bullmq-compat's per-group gate on PostgreSQL, version 3: priority within a group (BullMQ Pro's
-- group.priority; docs/groups.md, "Priority within a group").
--
-- A group job whose opts hold {"group": {"id": <gid>, "priority": p}}, p an integer from 1 to
-- 2097151, waits behind the group's unprioritised jobs (no priority, or 0) and behind those of a
-- lower p; FIFO among equal priorities. The gate's order is bullmq_compat_group_order(opts,
-- added_at_ms), then abs(seq): every reader of it -- the release (bullmq_compat_release_locked,
-- whoever finishes the job: a Python or a Node worker), the gate's decision for an add or a retry
-- (bullmq_compat_may_pass), the ordering delay's reclaim, group affinity's take, get_group_jobs --
-- and the held index bullmq_compat_group_held_idx order by it. So this version only redefines it:
-- an unprioritised job keeps its order (its order_ms, else its add time, below 2^42 ms), a
-- prioritised one is ordered p * 2^42 + its order, after every unprioritised one and every lower p,
-- and among equal p by its order, then its seq. A priority that is not an integer from 1 to 2097151
-- counts as none (the clients refuse it). The job's own priority (upstream's) is untouched: it applies once the job is released.
--
-- Upgrading a version-2 schema replaces bullmq_compat_group_order() in place and rebuilds the held
-- index on it (held jobs a Node producer added with a group priority before the upgrade take their
-- place by it from now on).

-- A job's group priority (opts.group.priority): 1 to 2097151, 0 for none (or not a valid one).
CREATE FUNCTION bullmq_compat_group_priority(p_opts jsonb) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT CASE WHEN jsonb_typeof(p_opts -> 'group' -> 'priority') = 'number'
                   AND (p_opts -> 'group' ->> 'priority')::numeric BETWEEN 1 AND 2097151
                   AND (p_opts -> 'group' ->> 'priority')::numeric % 1 = 0
              THEN (p_opts -> 'group' ->> 'priority')::integer ELSE 0 END
$$;

-- A group job's place in its group (ties: add sequence): p * 2^42 + its order (its order_ms, else
-- its add time), p its group priority (0: none). An order is a ms timestamp below 2^42 (the year
-- 2109; a prioritised job's is capped there), so (2^21 - 1) * 2^42 + an order fits a bigint exactly:
-- the order is (priority > 0, priority, order), then seq, and an unprioritised job's is its order
-- as in version 1. (Self-contained, as version 1's: it is an index expression.)
CREATE OR REPLACE FUNCTION bullmq_compat_group_order(p_opts jsonb, p_added_at_ms bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
  v_order bigint := p_added_at_ms;
  v_priority numeric;
BEGIN
  IF jsonb_typeof(p_opts -> 'group' -> 'orderMs') = 'number' THEN
    v_order := LEAST(GREATEST(floor((p_opts -> 'group' ->> 'orderMs')::numeric), 0), 9e15)::bigint;
  END IF;
  IF jsonb_typeof(p_opts -> 'group' -> 'priority') = 'number' THEN
    v_priority := (p_opts -> 'group' ->> 'priority')::numeric;
    IF v_priority BETWEEN 1 AND 2097151 AND v_priority % 1 = 0 THEN
      RETURN v_priority::bigint * 4398046511104 + LEAST(GREATEST(v_order, 0), 4398046511103); -- p * 2^42 + order
    END IF;
  END IF;
  RETURN v_order;
END;
$$;

-- the held index holds the old function's values: rebuilt on the new one
REINDEX INDEX bullmq_compat_group_held_idx;

-- Change the group priority of a held group job (job.change_priority on one that waits for its
-- turn): opts.group.priority := p_priority, which moves it within its group (its seq, so its place
-- among equal priorities, is kept). Returns 1 moved, 0 not a held group job (nothing changed: the
-- caller changes its own priority, as upstream does), -111 a priority >= 1 for a job with an
-- order_ms, -112 lifo (a held job's place among equal priorities is its add order).
-- (The queue's gate first, as the other API functions: an update of opts alone fires no trigger of
-- ours, and upstream's calls on a held row -- a removal -- take no gate.)
CREATE FUNCTION bullmq_compat_change_group_priority(p_queue text, p_id text, p_priority integer, p_lifo boolean)
RETURNS integer
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_opts jsonb;
  v_gid text;
BEGIN
  SELECT opts INTO v_opts FROM job
   WHERE queue = p_queue AND id = p_id AND opts ? 'group' AND state = 'waiting-children' AND pending_deps = 0;
  v_gid := bullmq_compat_gid(v_opts);
  IF v_gid IS NULL THEN
    RETURN 0;
  END IF;
  PERFORM bullmq_compat_lock_group(p_queue, v_gid);
  IF p_lifo THEN
    RETURN -112;
  END IF;
  IF p_priority > 0 AND bullmq_compat_order_ms(v_opts) IS NOT NULL THEN
    RETURN -111;
  END IF;
  UPDATE job SET opts = jsonb_set(opts, '{group,priority}', to_jsonb(p_priority))
   WHERE queue = p_queue AND id = p_id AND state = 'waiting-children' AND pending_deps = 0
     AND bullmq_compat_gid(opts) = v_gid;
  RETURN CASE WHEN FOUND THEN 1 ELSE 0 END;
END;
$$;
