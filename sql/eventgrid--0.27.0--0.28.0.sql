-- eventgrid 0.27.0 -> 0.28.0: RabbitMQ destinations (SPEC 21), and Redis
-- streams over TLS (rediss://, where hiredis has TLS).  An event
-- subscription of endpoint_type RabbitMQ publishes each event (or each
-- batch) to the exchange and routing key its amqp:// or amqps:// endpoint
-- names, persistent and mandatory, with publisher confirms; the broker's
-- user name and password are kept apart, as a Redis server's are.  A
-- RabbitMQ routing key or a Redis stream's key may be each event's subject
-- or its ordering key (routing_key_from=, stream_from=), the latter only
-- for an event subscription with an ordering_key.

\echo Use "ALTER EXTENSION eventgrid UPDATE TO '0.28.0'" to load this file. \quit

ALTER TABLE eventgrid.event_subscriptions
    DROP CONSTRAINT event_subscriptions_endpoint_type_check,
    ADD CONSTRAINT event_subscriptions_endpoint_type_check
        CHECK (endpoint_type IN ('WebHook', 'RedisStream', 'StorageQueue', 'RabbitMQ')
               AND (endpoint IS NULL OR ((endpoint_type = 'RedisStream') = (starts_with(endpoint, 'redis://')
                                                                 OR starts_with(endpoint, 'rediss://'))
                                         AND (endpoint_type = 'RabbitMQ') = (starts_with(endpoint, 'amqp://')
                                                                              OR starts_with(endpoint, 'amqps://')))));

COMMENT ON COLUMN eventgrid.event_subscriptions.endpoint_type IS 'Where a push event subscription delivers (SPEC 21): WebHook (HTTP POSTs to endpoint, an http(s) URL), RedisStream (an XADD per event to the Redis stream endpoint names, a redis:// URL), StorageQueue (a Put Message per event to the Azure Storage queue endpoint names, an http(s) URL) or RabbitMQ (a message per event or batch published to the exchange and routing key endpoint names, an amqp:// or amqps:// URL). A queue event subscription keeps WebHook and has no endpoint.';

COMMENT ON TABLE eventgrid.destination_credentials IS 'Internal: the credentials a destination is reached with (SPEC 21): kind password (a Redis server''s AUTH or a RabbitMQ broker''s login: user_name, NULL for none, and secret) or sas (a Storage queue''s SAS token), both taken out of the endpoint URL given to create_event_subscription() or update_event_subscription(), or shared_key (a Storage account''s key, set_storage_account_key()); readable by the extension''s owner only (never in a view); the delivery workers read them with each claim.';

COMMENT ON FUNCTION eventgrid._endpoint_problem(endpoint text) IS 'Internal: NULL when the endpoint can be delivered to, else why not: an http(s) URL libcurl''s URL parser accepts (a host, port 1-65535, no user name or password, at most 2048 bytes), a RedisStream endpoint redis://host[:port][/db]?stream=<key>[&maxlen=N][&mkstream=false] or a RabbitMQ endpoint amqp[s]://host[:port][/vhost]?exchange=<name>&routing_key=<key> (parsed by the same parser; no user name or password).';

COMMENT ON FUNCTION eventgrid._endpoint_credentials(endpoint text, OUT endpoint text, OUT user_name text, OUT password text) IS 'Internal: a RedisStream or RabbitMQ endpoint with a user name and password (redis://[user]:password@host..., amqp[s]://user:password@host...) as the endpoint without them (libcurl''s form of the URL) and the two, decoded; any other endpoint as it is, with NULLs.';

CREATE FUNCTION eventgrid._endpoint_key_from(endpoint text) RETURNS text
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_endpoint_key_from';

COMMENT ON FUNCTION eventgrid._endpoint_key_from(endpoint text) IS 'Internal: where the messages of a RabbitMQ or RedisStream endpoint take their key (routing key, stream) from: subject or ordering_key (routing_key_from=, stream_from=); NULL for a fixed key or any other endpoint.';

REVOKE ALL ON FUNCTION eventgrid._endpoint_key_from(endpoint text) FROM PUBLIC;

CREATE FUNCTION eventgrid._check_endpoint_key(endpoint text, ordering_key text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF ordering_key IS NULL AND eventgrid._endpoint_key_from(endpoint) = 'ordering_key' THEN
        RAISE EXCEPTION 'an endpoint that routes by the ordering key needs an ordering_key'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'routing_key_from=ordering_key or stream_from=ordering_key makes each event''s ordering key its routing key or stream; this event subscription has no ordering_key.',
                  HINT = 'Pass ordering_key => ''<field path>'' (for example ''data.customerId''), or route by subject or a fixed routing_key / stream.';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._check_endpoint_key(endpoint text, ordering_key text) IS 'Internal: raises 22023 when a RabbitMQ or RedisStream endpoint takes each message''s key from the ordering key (routing_key_from=ordering_key, stream_from=ordering_key) and the event subscription has no ordering_key.';

REVOKE ALL ON FUNCTION eventgrid._check_endpoint_key(endpoint text, ordering_key text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION eventgrid._check_endpoint(endpoint text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    problem text := eventgrid._endpoint_problem(endpoint);
BEGIN
    IF problem IS NOT NULL THEN
        -- a credential in a URL that could not be parsed is not shown
        RAISE EXCEPTION 'invalid endpoint %: %',
                        eventgrid._quote(regexp_replace(endpoint, '^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@', '\1***@')), problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = CASE WHEN starts_with(endpoint, 'redis') THEN
                      'A RedisStream endpoint is redis[s]://[[user]:password@]host[:port][/db]?stream=<key> (or stream_from=subject or ordering_key: each event''s subject or ordering key), with maxlen=<entries> and mkstream=false optional.'
                  WHEN starts_with(endpoint, 'amqp') THEN
                      'A RabbitMQ endpoint is amqp[s]://[user:password@]host[:port][/vhost]?exchange=<name>&routing_key=<key> (either may be left out, not both; routing_key_from=subject or ordering_key instead of routing_key routes each event by its subject or its ordering key).'
                  ELSE 'Use an absolute http:// or https:// URL of at most 2048 bytes with a host and no user name or password; send credentials as a secret delivery property.' END;
    END IF;
END $$;


CREATE OR REPLACE FUNCTION eventgrid._check_endpoint_type(endpoint_type text, endpoint text, endpoint_validation text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
    IF endpoint_type IS NULL OR endpoint_type NOT IN ('WebHook', 'RedisStream', 'StorageQueue', 'RabbitMQ') THEN
        RAISE EXCEPTION 'endpoint_type must be WebHook, RedisStream, StorageQueue or RabbitMQ, got %', coalesce(eventgrid._quote(endpoint_type), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'WebHook (the default) POSTs to an http(s) URL; RedisStream XADDs each event to the stream a redis:// URL names; StorageQueue puts each event on the Azure Storage queue an http(s) URL names; RabbitMQ publishes each event to the exchange an amqp(s):// URL names.';
    END IF;
    IF endpoint IS NOT NULL AND ((endpoint_type = 'RedisStream') <> (starts_with(endpoint, 'redis://') OR starts_with(endpoint, 'rediss://'))
                                 OR (endpoint_type = 'RabbitMQ') <> (starts_with(endpoint, 'amqp://') OR starts_with(endpoint, 'amqps://'))) THEN
        RAISE EXCEPTION 'an endpoint of type % must be %', endpoint_type,
                        CASE endpoint_type WHEN 'RedisStream' THEN 'a redis:// or rediss:// URL'
                                           WHEN 'RabbitMQ' THEN 'an amqp:// or amqps:// URL'
                                           ELSE 'an http:// or https:// URL' END
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass the endpoint_type that goes with the endpoint: RedisStream for redis://host:port/db?stream=<key>, RabbitMQ for amqp[s]://host:port/vhost?exchange=<name>&routing_key=<key>, WebHook or StorageQueue for http(s).';
    END IF;
    IF endpoint IS NOT NULL AND endpoint_type = 'StorageQueue'
       AND endpoint !~ '^https?://([a-z0-9]{3,24}\.queue\.[^/?#]+/|[^/?#]+/[a-z0-9]{3,24}/)[a-z0-9](-?[a-z0-9]){2,62}(\?queueMessageTimeToLiveInSeconds=(-1|[1-9][0-9]{0,9}))?$' THEN
        RAISE EXCEPTION 'a StorageQueue endpoint must be a queue''s URL'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'https://<account>.queue.core.windows.net/<queue> or, path-style (an emulator), http://127.0.0.1:10001/<account>/<queue>: an account name of 3-24 lower-case letters and digits, a queue name of 3-63 lower-case letters, digits and single hyphens; queueMessageTimeToLiveInSeconds=<-1 or 1-2147483647> and a SAS token may follow as its query.';
    END IF;
    IF endpoint_type = 'StorageQueue' AND substring(endpoint FROM 'queueMessageTimeToLiveInSeconds=([0-9]+)$')::bigint > 2147483647 THEN
        RAISE EXCEPTION 'queueMessageTimeToLiveInSeconds must be -1 (never expires) or 1 to 2147483647 seconds'
            USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    IF endpoint_type <> 'WebHook' AND endpoint_validation = 'handshake' THEN
        RAISE EXCEPTION 'endpoint_validation handshake is for WebHook endpoints only'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A destination such as a Redis stream or a RabbitMQ exchange does not answer a validation handshake: omit endpoint_validation.';
    END IF;
END $_$;

COMMENT ON FUNCTION eventgrid._check_endpoint_type(endpoint_type text, endpoint text, endpoint_validation text) IS 'Internal: checks a push event subscription''s endpoint_type (WebHook, RedisStream, StorageQueue or RabbitMQ, 22023), that its endpoint goes with it (redis:// or rediss:// for RedisStream; amqp:// or amqps:// for RabbitMQ; a queue''s URL for StorageQueue, with queueMessageTimeToLiveInSeconds -1 or 1-2147483647 as its only query once the SAS token is taken out: 22023, 22003), and that only a WebHook is validated by a handshake (22023).';

CREATE OR REPLACE FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text DEFAULT NULL::text, event_delivery_schema text DEFAULT NULL::text, included_event_types text[] DEFAULT NULL::text[], subject_begins_with text DEFAULT NULL::text, subject_ends_with text DEFAULT NULL::text, is_subject_case_sensitive boolean DEFAULT false, max_delivery_attempts integer DEFAULT NULL::integer, event_ttl integer DEFAULT NULL::integer, max_events_per_batch integer DEFAULT NULL::integer, preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer, deadletter boolean DEFAULT false, advanced_filters jsonb DEFAULT NULL::jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT false, max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text, max_events_per_second integer DEFAULT NULL::integer, endpoint_validation text DEFAULT 'none'::text, dead_letter_topic text DEFAULT NULL::text, ordering_key text DEFAULT NULL::text, delivery_mode text DEFAULT 'push'::text, receive_lock_duration integer DEFAULT NULL::integer, expiration_time timestamp with time zone DEFAULT NULL::timestamp with time zone, endpoint_type text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    in_schema text;
    ttype text;
    attempts integer;
    ttl integer;
    sid bigint;
    dt text;
    cred_user text;
    cred_password text;
    cred_kind text;
BEGIN
    PERFORM eventgrid._check_not_null('topic', topic);
    -- 'domain/topic': a subscription at domain-topic scope (SPEC 18)
    IF strpos(topic, '/') > 0 THEN
        dt := substr(topic, strpos(topic, '/') + 1);
        topic := split_part(topic, '/', 1);
    END IF;
    SELECT t.input_schema, t.topic_type INTO in_schema, ttype
      FROM eventgrid.topics t WHERE t.name = topic FOR KEY SHARE;
    IF in_schema IS NULL THEN
        RAISE EXCEPTION '% % does not exist', CASE WHEN dt IS NULL THEN 'topic' ELSE 'domain' END, eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object',
                  HINT = CASE WHEN dt IS NULL THEN 'Create it first with eventgrid.create_topic().'
                              ELSE 'Create it first with eventgrid.create_domain().' END;
    END IF;
    IF dt IS NOT NULL THEN
        PERFORM eventgrid._domain_topic_for_subscription(topic, dt);
    END IF;
    IF name IS NULL THEN
        RAISE EXCEPTION 'event subscription name must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM eventgrid._check_delivery_mode(delivery_mode, ttype, endpoint, receive_lock_duration,
        max_events_per_batch, preferred_batch_size_in_kilobytes, max_events_per_second, endpoint_validation,
        ordering_key);
    IF delivery_mode = 'queue' THEN
        receive_lock_duration := coalesce(receive_lock_duration, 60);
        PERFORM eventgrid._check_no_endpoint_type(endpoint_type, name, topic);
    ELSE
        endpoint_type := coalesce(endpoint_type, 'WebHook');
        -- a Redis or RabbitMQ password or a SAS token goes where secrets go, not into the stored endpoint
        IF endpoint_type IN ('RedisStream', 'RabbitMQ') THEN
            SELECT c.endpoint, c.user_name, c.password, 'password' INTO endpoint, cred_user, cred_password, cred_kind
              FROM eventgrid._endpoint_credentials(endpoint) c;
        ELSIF endpoint_type = 'StorageQueue' THEN
            SELECT c.endpoint, c.sas, 'sas' INTO endpoint, cred_password, cred_kind
              FROM eventgrid._storage_queue_sas(endpoint) c;
        END IF;
        PERFORM eventgrid._check_endpoint_type(endpoint_type, endpoint, endpoint_validation);
    END IF;
    IF NOT eventgrid._is_subscription_name(name) THEN
        RAISE EXCEPTION 'invalid event subscription name %', eventgrid._quote(name)
            USING ERRCODE = 'invalid_name',
                  HINT = 'An event subscription name has 3 to 64 characters: letters, digits and hyphens.';
    END IF;
    event_delivery_schema := coalesce(event_delivery_schema, in_schema);
    PERFORM eventgrid._check_subscription_settings(in_schema, ttype, endpoint, event_delivery_schema,
        included_event_types, is_subject_case_sensitive, deadletter, enable_advanced_filtering_on_arrays,
        max_events_per_batch, preferred_batch_size_in_kilobytes, max_events_per_second);
    SELECT r.attempts, r.ttl INTO attempts, ttl
      FROM eventgrid._retry_policy_args(ttype, max_delivery_attempts, event_ttl, max_delivery_count,
                                        event_time_to_live) r;
    advanced_filters := eventgrid._advanced_filters_arg(advanced_filters);
    PERFORM eventgrid._check_endpoint_validation(endpoint_validation);
    PERFORM eventgrid._check_dead_letter_topic(dead_letter_topic);
    PERFORM eventgrid._check_ordering_key(ordering_key);
    PERFORM eventgrid._check_endpoint_key(endpoint, ordering_key);
    expiration_time := eventgrid._expiration_time_arg(expiration_time);
    IF EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s
                WHERE s.topic = create_event_subscription.topic AND s.name = create_event_subscription.name
                  AND s.domain_topic IS NULL AND dt IS NULL)
       OR EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s
                   WHERE s.topic = create_event_subscription.topic AND s.name = create_event_subscription.name
                     AND s.domain_topic = dt) THEN
        RAISE EXCEPTION 'event subscription "%" already exists for topic "%"', name,
                        topic || coalesce('/' || dt, '')
            USING ERRCODE = 'duplicate_object';
    END IF;
    INSERT INTO eventgrid.event_subscriptions AS s
        (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
         subject_ends_with, is_subject_case_sensitive, max_delivery_attempts, event_ttl,
         max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, topic_type,
         advanced_filters, enable_advanced_filtering_on_arrays, max_events_per_second, dead_letter_topic, ordering_key,
         delivery_mode, receive_lock_duration, expiration_time, domain_topic, endpoint_type)
    VALUES (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
            subject_ends_with, is_subject_case_sensitive, coalesce(attempts, CASE ttype WHEN 'namespace' THEN 10 ELSE 30 END),
            coalesce(ttl, CASE ttype WHEN 'namespace' THEN 10080 ELSE 1440 END),
            max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, ttype,
            advanced_filters, enable_advanced_filtering_on_arrays, max_events_per_second, dead_letter_topic, ordering_key,
            delivery_mode, receive_lock_duration, expiration_time, dt, coalesce(endpoint_type, 'WebHook'))
    RETURNING s.id INTO sid;
    INSERT INTO eventgrid.subscription_counters (subscription_id) VALUES (sid);
    IF cred_password IS NOT NULL THEN
        INSERT INTO eventgrid.destination_credentials (subscription_id, kind, user_name, secret)
        VALUES (sid, cred_kind, cred_user, cred_password);
    END IF;
    -- events of transactions that commit after this one's snapshot are for it.  The upkeep worker
    -- cannot see this position before it commits: were an event table emptied meanwhile, the events
    -- of a transaction in progress at the snapshot that committed since would be lost to it.  So the
    -- event tables are locked first (ACCESS SHARE, until this transaction ends: the rotation's
    -- TRUNCATE takes its lock only if it is free), and the snapshot taken after the lock.  A
    -- REPEATABLE READ or SERIALIZABLE transaction took its snapshot earlier: if a table was emptied
    -- since (a new relfilenode, which pg_class as of the snapshot does not have yet), it is refused
    LOCK TABLE eventgrid.events IN ACCESS SHARE MODE;
    IF current_setting('transaction_isolation') <> 'read committed'
       AND EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                    WHERE i.inhparent = 'eventgrid.events'::regclass
                      AND c.relfilenode IS DISTINCT FROM pg_relation_filenode(c.oid)) THEN
        RAISE EXCEPTION 'an event table was emptied after this transaction''s snapshot was taken'
            USING ERRCODE = 'serialization_failure',
                  DETAIL = 'The new event subscription is owed the events of the transactions in progress at the snapshot; some may be gone.',
                  HINT = 'Retry the transaction, or create the event subscription in a READ COMMITTED transaction.';
    END IF;
    INSERT INTO eventgrid.subscription_positions (subscription_id, since, done)
    VALUES (sid, pg_current_snapshot(), pg_current_snapshot());
    PERFORM eventgrid._subscriptions_changed_at_commit();
    IF endpoint_validation = 'handshake' THEN
        -- nothing is delivered until the endpoint answers the handshake
        PERFORM eventgrid._start_validation(sid);
        PERFORM eventgrid._wake_worker_at_commit();
    END IF;
    IF expiration_time IS NOT NULL THEN
        -- the upkeep worker plans its next round by the earliest expiration
        PERFORM eventgrid._wake_worker_at_commit();
    END IF;
    RETURN sid;
END $$;

COMMENT ON FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, delivery_mode text, receive_lock_duration integer, expiration_time timestamp with time zone, endpoint_type text) IS 'Creates an event subscription and returns its id. topic: a topic, a domain (domain scope: every domain topic''s events) or ''domain/topic'' (domain-topic scope: that domain topic''s events; created with it when the domain creates topics with their first subscription, else 42704; SPEC 18); names are unique per topic, domain or domain topic. endpoint (push): for endpoint_type WebHook (the default) an http(s) URL that libcurl parses, with a host, at most 2048 bytes (no user name or password); for RedisStream redis[s]://[[user]:password@]host[:port][/db]?stream=<key>[&maxlen=N][&mkstream=false] (rediss: TLS, where this builds hiredis has it; stream_from=subject or ordering_key instead of stream: each event''s subject or ordering key names its stream, ordering_key needing the subscription''s ordering_key (22023); SPEC 21; the user name and password are stored apart, readable by the extension''s owner only; see README, Redis streams). event_delivery_schema: defaults to the topic''s input schema (namespace topics: CloudEvents only). Filters: included_event_types (case-insensitive), subject_begins_with / subject_ends_with (case-insensitive unless is_subject_case_sensitive), advanced_filters (Event Grid JSON, see set_advanced_filters) with enable_advanced_filtering_on_arrays (false). Retry policy of a custom topic: max_delivery_attempts 1-30 (30), event_ttl 1-1440 minutes (1440); of a namespace topic: max_delivery_count 1-10 (10), event_time_to_live ISO 8601 PT1M-P7D (P7D); the other profile''s arguments are refused. max_events_per_batch 1-5000, preferred_batch_size_in_kilobytes 1-1024 (either turns batching on), deadletter (false). max_events_per_second 1-100,000 (NULL: no rate limit; a batch counts its events, retries count; events over the rate wait in the queue). endpoint_validation: none (default) or handshake (Event Grid''s SubscriptionValidationEvent, or for CloudEvents the webhook OPTIONS request; nothing is delivered until the endpoint is validated, see event_subscription_validation). dead_letter_topic: a topic (of this database) to which each event this subscription dead-letters or drops is published as a notification, in the transaction that records it (see README, Dead-letter notifications; NULL: none). ordering_key: a dotted field path (1-512 characters, as a dynamic delivery property''s source_field: subject, data.orderId, partitionkey) whose value (string, number or boolean) is each event''s key: events of one key are delivered in publish order, one request at a time across all delivery workers, the next only once the one before is delivered, dead-lettered or dropped; events without it go unordered (NULL: unordered; see README, Ordered delivery). delivery_mode: push (default: delivered to endpoint) or queue (pull delivery, namespace topics only: no endpoint, batching, rate limit, endpoint validation or ordering_key; consumers call receive(), see README, Pull delivery); receive_lock_duration: of a queue subscription, seconds 60-300 (60) a received event stays locked. expiration_time: when the event subscription expires (NULL or ''infinity'': never; else it must be in the future of the real clock): from then on nothing more is delivered or received for it, and the upkeep worker drops it as drop_event_subscription() would (its dead letters are kept; see README, Expiration). endpoint_type: WebHook (default), RedisStream (each event XADDed to a Redis stream; no endpoint validation, batching or bearer tokens: see README, Redis streams) or StorageQueue (endpoint: the queue''s URL, https://<account>.queue.core.windows.net/<queue> or path-style http://127.0.0.1:10001/<account>/<queue>, queueMessageTimeToLiveInSeconds and a SAS token as its query, the token stored apart; each event a message, base64 JSON; an account key through set_storage_account_key(), or a Microsoft Entra ID bearer token; see README, Storage queues); RabbitMQ (endpoint amqp[s]://[user:password@]host[:port][/vhost]?exchange=<name>&routing_key=<key>, or routing_key_from=subject or ordering_key for each event''s subject or ordering key as its routing key (ordering_key: only with the subscription''s ordering_key, 22023; an event without a key is not sent, InvalidHeader), the user name and password stored apart; each event, or each batch as a JSON array, a persistent message published mandatory and delivered once the broker confirms it: see README, RabbitMQ); a queue subscription takes none (22023). Requires eventgrid_admin. Errors: 42704 (also no such dead_letter_topic), 42602, 22023, 22003, 22004, 54000, 42710, 40001 (a REPEATABLE READ or SERIALIZABLE transaction whose snapshot an event table''s emptying followed: retry it). SPEC 1, 4, 5, 7, 9, 13, 14, 17, 18, 21.';

CREATE OR REPLACE FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text DEFAULT NULL::text, event_delivery_schema text DEFAULT NULL::text, included_event_types text[] DEFAULT NULL::text[], subject_begins_with text DEFAULT NULL::text, subject_ends_with text DEFAULT NULL::text, is_subject_case_sensitive boolean DEFAULT NULL::boolean, max_delivery_attempts integer DEFAULT NULL::integer, event_ttl integer DEFAULT NULL::integer, max_events_per_batch integer DEFAULT NULL::integer, preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer, deadletter boolean DEFAULT NULL::boolean, advanced_filters jsonb DEFAULT NULL::jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT NULL::boolean, max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text, max_events_per_second integer DEFAULT NULL::integer, endpoint_validation text DEFAULT NULL::text, dead_letter_topic text DEFAULT NULL::text, ordering_key text DEFAULT NULL::text, receive_lock_duration integer DEFAULT NULL::integer, expiration_time timestamp with time zone DEFAULT NULL::timestamp with time zone, endpoint_type text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, name, true);
    cur eventgrid.event_subscriptions;
    in_schema text;
    attempts integer;
    ttl integer;
    cred_user text;
    cred_password text;
    cred_kind text;
    new_endpoint boolean;
BEGIN
    SELECT s.* INTO cur FROM eventgrid.event_subscriptions s WHERE s.id = sid;
    SELECT t.input_schema INTO in_schema FROM eventgrid.topics t WHERE t.name = cur.topic;
    IF cur.delivery_mode = 'queue' AND update_event_subscription.endpoint IS NOT NULL THEN
        RAISE EXCEPTION 'event subscription "%" of topic "%" is a queue event subscription: it has no endpoint', name, topic
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'delivery_mode cannot change: create a push event subscription beside it.';
    END IF;
    IF cur.delivery_mode = 'queue' THEN
        PERFORM eventgrid._check_no_endpoint_type(endpoint_type, name, topic);
    END IF;
    -- NULL keeps a setting; an empty array, '' or 0 clears one that may be unset
    endpoint_type := coalesce(endpoint_type, cur.endpoint_type);
    -- a Redis or RabbitMQ password or a SAS token goes where secrets go, not into the stored endpoint
    IF endpoint IS NOT NULL AND endpoint_type IN ('RedisStream', 'RabbitMQ') THEN
        SELECT c.endpoint, c.user_name, c.password, 'password' INTO endpoint, cred_user, cred_password, cred_kind
          FROM eventgrid._endpoint_credentials(endpoint) c;
    ELSIF endpoint IS NOT NULL AND endpoint_type = 'StorageQueue' THEN
        SELECT c.endpoint, c.sas, 'sas' INTO endpoint, cred_password, cred_kind
          FROM eventgrid._storage_queue_sas(endpoint) c;
    END IF;
    new_endpoint := endpoint IS NOT NULL;
    endpoint := coalesce(endpoint, cur.endpoint);
    IF cur.delivery_mode = 'push' THEN
        PERFORM eventgrid._check_endpoint_type(endpoint_type, endpoint, endpoint_validation);
        IF endpoint_type <> 'WebHook' THEN
            endpoint_validation := 'none';  -- a destination is not validated by a handshake
        END IF;
    END IF;
    receive_lock_duration := coalesce(receive_lock_duration, cur.receive_lock_duration);
    event_delivery_schema := coalesce(event_delivery_schema, cur.event_delivery_schema);
    included_event_types := CASE WHEN included_event_types IS NULL THEN cur.included_event_types
                                 WHEN cardinality(included_event_types) = 0 THEN NULL
                                 ELSE included_event_types END;
    subject_begins_with := CASE WHEN subject_begins_with IS NULL THEN cur.subject_begins_with
                                ELSE nullif(subject_begins_with, '') END;
    subject_ends_with := CASE WHEN subject_ends_with IS NULL THEN cur.subject_ends_with
                              ELSE nullif(subject_ends_with, '') END;
    is_subject_case_sensitive := coalesce(is_subject_case_sensitive, cur.is_subject_case_sensitive);
    deadletter := coalesce(deadletter, cur.deadletter);
    enable_advanced_filtering_on_arrays := coalesce(enable_advanced_filtering_on_arrays,
                                                    cur.enable_advanced_filtering_on_arrays);
    max_events_per_batch := CASE WHEN max_events_per_batch IS NULL THEN cur.max_events_per_batch
                                 ELSE nullif(max_events_per_batch, 0) END;
    preferred_batch_size_in_kilobytes := CASE WHEN preferred_batch_size_in_kilobytes IS NULL
                                              THEN cur.preferred_batch_size_in_kilobytes
                                              ELSE nullif(preferred_batch_size_in_kilobytes, 0) END;
    max_events_per_second := CASE WHEN max_events_per_second IS NULL THEN cur.max_events_per_second
                                  ELSE nullif(max_events_per_second, 0) END;
    PERFORM eventgrid._check_subscription_settings(in_schema, cur.topic_type, endpoint, event_delivery_schema,
        included_event_types, is_subject_case_sensitive, deadletter, enable_advanced_filtering_on_arrays,
        max_events_per_batch, preferred_batch_size_in_kilobytes, max_events_per_second);
    PERFORM eventgrid._check_delivery_mode(cur.delivery_mode, cur.topic_type, endpoint, receive_lock_duration,
        max_events_per_batch, preferred_batch_size_in_kilobytes, max_events_per_second, endpoint_validation,
        nullif(coalesce(ordering_key, cur.ordering_key), ''));
    SELECT r.attempts, r.ttl INTO attempts, ttl
      FROM eventgrid._retry_policy_args(cur.topic_type, max_delivery_attempts, event_ttl, max_delivery_count,
                                        event_time_to_live) r;
    advanced_filters := CASE WHEN advanced_filters IS NULL THEN cur.advanced_filters
                             ELSE eventgrid._advanced_filters_arg(advanced_filters) END;
    IF endpoint_validation IS NOT NULL THEN
        PERFORM eventgrid._check_endpoint_validation(endpoint_validation);
    END IF;
    dead_letter_topic := CASE WHEN dead_letter_topic IS NULL THEN cur.dead_letter_topic
                              ELSE nullif(dead_letter_topic, '') END;
    PERFORM eventgrid._check_dead_letter_topic(dead_letter_topic);
    ordering_key := CASE WHEN ordering_key IS NULL THEN cur.ordering_key ELSE nullif(ordering_key, '') END;
    PERFORM eventgrid._check_ordering_key(ordering_key);
    PERFORM eventgrid._check_endpoint_key(endpoint, ordering_key);
    -- NULL keeps it, 'infinity' clears it
    expiration_time := CASE WHEN expiration_time IS NULL THEN cur.expiration_time
                            ELSE eventgrid._expiration_time_arg(expiration_time) END;
    IF ordering_key IS DISTINCT FROM cur.ordering_key THEN
        -- after the claim or record that holds the position: events it moved are in the retries
        PERFORM 1 FROM eventgrid.subscription_positions p WHERE p.subscription_id = sid FOR UPDATE;
        IF ordering_key IS NULL THEN
            -- unordered from now on: what waited for its key is due at once
            UPDATE eventgrid.retries r
               SET ordering_key = NULL,
                   next_attempt_at = CASE WHEN r.next_attempt_at = 'infinity' THEN eventgrid._now()
                                          ELSE r.next_attempt_at END
             WHERE r.subscription_id = sid AND r.ordering_key IS NOT NULL;
            DELETE FROM eventgrid.ordering_keys k WHERE k.subscription_id = sid;
        END IF;
    END IF;
    UPDATE eventgrid.event_subscriptions s
       SET endpoint = update_event_subscription.endpoint,
           event_delivery_schema = update_event_subscription.event_delivery_schema,
           included_event_types = update_event_subscription.included_event_types,
           subject_begins_with = update_event_subscription.subject_begins_with,
           subject_ends_with = update_event_subscription.subject_ends_with,
           is_subject_case_sensitive = update_event_subscription.is_subject_case_sensitive,
           max_delivery_attempts = coalesce(attempts, s.max_delivery_attempts),
           event_ttl = coalesce(ttl, s.event_ttl),
           max_events_per_batch = update_event_subscription.max_events_per_batch,
           preferred_batch_size_in_kilobytes = update_event_subscription.preferred_batch_size_in_kilobytes,
           deadletter = update_event_subscription.deadletter,
           advanced_filters = update_event_subscription.advanced_filters,
           enable_advanced_filtering_on_arrays = update_event_subscription.enable_advanced_filtering_on_arrays,
           max_events_per_second = update_event_subscription.max_events_per_second,
           dead_letter_topic = update_event_subscription.dead_letter_topic,
           ordering_key = update_event_subscription.ordering_key,
           receive_lock_duration = update_event_subscription.receive_lock_duration,
           expiration_time = update_event_subscription.expiration_time,
           endpoint_type = update_event_subscription.endpoint_type
     WHERE s.id = sid;
    IF new_endpoint THEN
        -- a new endpoint brings its own credentials, or none; a Storage queue keeps an account key
        -- (set_storage_account_key()) unless the endpoint brings a SAS token
        DELETE FROM eventgrid.destination_credentials c
         WHERE c.subscription_id = sid
           AND (c.kind <> 'shared_key' OR cred_password IS NOT NULL OR endpoint_type <> 'StorageQueue');
        IF cred_password IS NOT NULL THEN
            INSERT INTO eventgrid.destination_credentials (subscription_id, kind, user_name, secret)
            VALUES (sid, cred_kind, cred_user, cred_password);
        END IF;
    END IF;
    IF event_delivery_schema <> cur.event_delivery_schema THEN
        -- a retry keeps the text it is sent as: made again in the new schema
        UPDATE eventgrid.retries r
           SET payload = eventgrid.convert_event(r.event, in_schema, update_event_subscription.event_delivery_schema,
                                                 r.publish_time)::text
         WHERE r.subscription_id = sid;
    END IF;
    IF endpoint <> cur.endpoint THEN
        -- without the statement, which holds the URL
        PERFORM eventgrid._log(format('eventgrid: endpoint of event subscription "%s" of topic "%s" changed by %s',
                                      name, topic, eventgrid._caller()));
    END IF;
    -- a new endpoint, or a new handshake, is validated again; none ends validation
    IF endpoint_validation = 'none' THEN
        DELETE FROM eventgrid.endpoint_validations v WHERE v.subscription_id = sid;
    ELSIF endpoint_validation = 'handshake'
          OR (endpoint <> cur.endpoint
              AND EXISTS (SELECT 1 FROM eventgrid.endpoint_validations v WHERE v.subscription_id = sid))
          OR (event_delivery_schema <> cur.event_delivery_schema
              AND EXISTS (SELECT 1 FROM eventgrid.endpoint_validations v WHERE v.subscription_id = sid)) THEN
        PERFORM eventgrid._start_validation(sid);
    END IF;
    IF expiration_time IS DISTINCT FROM cur.expiration_time THEN
        -- the upkeep worker plans its next round by the earliest expiration
        PERFORM eventgrid._wake_worker_at_commit();
    END IF;
    -- requests claimed with the old settings and not sent yet go back
    PERFORM eventgrid._subscriptions_changed_at_commit();
END $$;

COMMENT ON FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, receive_lock_duration integer, expiration_time timestamp with time zone, endpoint_type text) IS 'Changes an event subscription in place (as az eventgrid event-subscription update); the arguments are create_event_subscription''s, with the same ranges, checks and SQLSTATEs. A NULL argument keeps the setting; to clear one pass an empty array (included_event_types: all types), an empty string (subject_begins_with, subject_ends_with, dead_letter_topic), [] (advanced_filters) or 0 (max_events_per_batch, preferred_batch_size_in_kilobytes: both cleared turns batching off; max_events_per_second: no rate limit). endpoint_validation: handshake validates the endpoint again (so does a new endpoint or delivery schema of a subscription that validates), none stops validating. The position, the first attempts in flight and the retries are kept, and the next claim uses the new settings: a new endpoint gets its own health state; with a new event_delivery_schema the retries are converted. ordering_key: a new path keys the events claimed from now on (those waiting keep their keys); '''' makes the subscription unordered and what waited for its key due at once. A changed endpoint is logged, without the URL. delivery_mode cannot change (a queue subscription refuses an endpoint, 22023); receive_lock_duration (60-300 seconds, queue subscriptions only) applies to the locks taken from then on. expiration_time: a new expiration time (in the future), or ''infinity'' to clear it (never expires). endpoint_type: WebHook, RedisStream, StorageQueue or RabbitMQ, changed together with an endpoint of that type (a destination that is not a WebHook ends any endpoint validation); a new endpoint replaces the destination''s credentials with its own (or none; a Storage queue keeps an account key unless the endpoint brings a SAS token). Requires eventgrid_admin. Errors: 22004, 42704, 22023, 22003, 54000. SPEC 1, 4, 5, 7, 9, 13, 14, 17, 18, 21.';
