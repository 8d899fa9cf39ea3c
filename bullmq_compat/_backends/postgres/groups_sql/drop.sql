-- Remove bullmq-compat's group gate from a schema (bullmq-compat migrate --drop-groups), leaving
-- upstream's objects exactly as Node's migrations made them. Held group jobs are first released to
-- wait (without their gate they would wait in waiting-children for ever); their group order then
-- no longer holds. Run with search_path set to the queue schema.
DROP TRIGGER IF EXISTS bullmq_compat_gate_insert ON job;
DROP TRIGGER IF EXISTS bullmq_compat_gate_update ON job;
DROP TRIGGER IF EXISTS bullmq_compat_gate_arrival ON job; -- (an early build's, as release_update)
DROP TRIGGER IF EXISTS bullmq_compat_release_update ON job;
DROP TRIGGER IF EXISTS bullmq_compat_release_delete ON job;
DROP TRIGGER IF EXISTS bullmq_compat_event_rewrite ON event; -- (an early build's, replaced by bullmq_compat_gated)
DO $$
DECLARE
  v_queue text;
BEGIN
  IF to_regclass('bullmq_compat_migration') IS NULL THEN
    RETURN;
  END IF;
  FOR v_queue IN
    WITH released AS (
      UPDATE job SET state = 'waiting', process_at_ms = NULL, seq = nextval('job_seq')
       WHERE opts ? 'group' AND jsonb_typeof(opts -> 'group') = 'object' AND state = 'waiting-children'
         AND pending_deps = 0
      RETURNING queue, id
    )
    SELECT DISTINCT queue FROM released
  LOOP
    PERFORM pg_notify('bullmq_jobs', v_queue);
  END LOOP;
END;
$$;
DROP INDEX IF EXISTS bullmq_compat_group_running_idx;
DROP INDEX IF EXISTS bullmq_compat_group_held_idx;
DROP FUNCTION IF EXISTS bullmq_compat_gate_insert();
DROP FUNCTION IF EXISTS bullmq_compat_gate_arrival();
DROP FUNCTION IF EXISTS bullmq_compat_gate_update();
DROP FUNCTION IF EXISTS bullmq_compat_release_trigger();
DROP FUNCTION IF EXISTS bullmq_compat_event_rewrite();
DROP TABLE IF EXISTS bullmq_compat_gated;
DROP FUNCTION IF EXISTS bullmq_compat_gated_events();
DROP FUNCTION IF EXISTS bullmq_compat_note_gated(text, text);
DROP FUNCTION IF EXISTS bullmq_compat_list_group_rates(text, bigint);
DROP FUNCTION IF EXISTS bullmq_compat_rate_limit_job(text, text, text, bigint, bigint);
DROP FUNCTION IF EXISTS bullmq_compat_group_rate_ttl(text, text, bigint);
DROP FUNCTION IF EXISTS bullmq_compat_set_group_rate_limit(text, text, integer, bigint, bigint);
DROP FUNCTION IF EXISTS bullmq_compat_forget_default_group(text, text);
DROP FUNCTION IF EXISTS bullmq_compat_rate_due(text, text, bigint, integer, bigint, bigint);
DROP FUNCTION IF EXISTS bullmq_compat_rate_limit(text, text);
DROP TABLE IF EXISTS bullmq_compat_group_start;
DROP FUNCTION IF EXISTS bullmq_compat_set_group(text, text, text, bigint, bigint);
DROP FUNCTION IF EXISTS bullmq_compat_delete_group_jobs(text, text);
DROP FUNCTION IF EXISTS bullmq_compat_list_groups(text);
DROP FUNCTION IF EXISTS bullmq_compat_take_group_jobs(text, text, text[], bigint, bigint, text);
DROP FUNCTION IF EXISTS bullmq_compat_sweep_groups(text, bigint);
DROP FUNCTION IF EXISTS bullmq_compat_release(text, text, bigint);
DROP FUNCTION IF EXISTS bullmq_compat_release_locked(text, text, bigint);
DROP FUNCTION IF EXISTS bullmq_compat_release_locked(text, text, bigint, integer);
DROP FUNCTION IF EXISTS bullmq_compat_release_rated(text, text, bigint, integer);
DROP FUNCTION IF EXISTS bullmq_compat_may_pass(text, text, bigint, bigint, boolean, bigint, boolean, integer);
DROP FUNCTION IF EXISTS bullmq_compat_reclaim(text, text, bigint);
DROP FUNCTION IF EXISTS bullmq_compat_due(jsonb, bigint, bigint, bigint);
DROP FUNCTION IF EXISTS bullmq_compat_running(text, text);
DROP FUNCTION IF EXISTS bullmq_compat_group_settings(text, text);
DROP FUNCTION IF EXISTS bullmq_compat_lock_group(text, text);
DROP FUNCTION IF EXISTS bullmq_compat_one_job_statement();
DROP FUNCTION IF EXISTS bullmq_compat_now();
DROP FUNCTION IF EXISTS bullmq_compat_change_group_priority(text, text, integer, boolean);
DROP FUNCTION IF EXISTS bullmq_compat_group_priority(jsonb);
DROP FUNCTION IF EXISTS bullmq_compat_group_order(jsonb, bigint);
DROP FUNCTION IF EXISTS bullmq_compat_order_ms(jsonb);
DROP FUNCTION IF EXISTS bullmq_compat_group_is_full(text, text, bigint);
DROP FUNCTION IF EXISTS bullmq_compat_max_size(jsonb);
DROP FUNCTION IF EXISTS bullmq_compat_gid(jsonb);
DROP TABLE IF EXISTS bullmq_compat_group;
DROP TABLE IF EXISTS bullmq_compat_group_queue;
DROP TABLE IF EXISTS bullmq_compat_migration;
