/*
 * settings.c - eventgrid's GUCs (eventgrid.*): their variables, their
 * definitions with units, ranges and defaults, and the checks of the two
 * that become a request header or a file path.  The README's "Settings"
 * section documents each.
 */
#include "core/eventgrid.h"

#include <unistd.h>

#include "miscadmin.h"
#include "utils/guc.h"

char	   *eg_database_name = NULL;
int			eg_max_databases = 1000;
int			eg_worker_idle_timeout_s = 120;
int			eg_delivery_workers = 1;
int			eg_max_concurrent_requests = 64;
int			eg_response_timeout_ms = 30000;
int			eg_retry_jitter_percent = 10;
int			eg_max_retry_after_s = 3600;
int			eg_clock_offset_s = 0;
int			eg_default_max_events_per_batch = 10;
int			eg_default_preferred_batch_kb = 64;
bool		eg_delivery_paused = false;
int			eg_max_bytes_in_flight_kb = 16 * 1024;
int			eg_event_table_rotation_s = 10;
int			eg_event_retention_s = 0;
int			eg_replication_sync_wait_s = 300;
int			eg_max_requests_per_endpoint = 32;
int			eg_probation_failures = 10;
int			eg_attempt_history = EG_HISTORY_ALL;
int			eg_attempt_history_retention_s = 24 * 3600;
int			eg_attempt_history_max_rows = 1000000;
char	   *eg_ssl_ca_file = NULL;
char	   *eg_webhook_request_origin = NULL;
char	   *eg_entra_authority = NULL;
int			eg_http_port = 0;
char	   *eg_http_listen_addresses = NULL;
char	   *eg_http_ssl_cert_file = NULL;
char	   *eg_http_ssl_key_file = NULL;
int			eg_http_max_connections = 100;
int			eg_http_connection_timeout_s = 30;
int			eg_http_request_timeout_s = 10;
int			eg_http_max_connections_per_address = 32;
int			eg_http_max_requests_in_flight = 32;
char	   *eg_debug_pause_points = NULL;

/* eventgrid.metrics_per_topic: read by the metric views (SQL), not by C */
static bool metrics_per_topic = false;

static const struct config_enum_entry history_modes[] = {
	{"all", EG_HISTORY_ALL, false},
	{"failures", EG_HISTORY_FAILURES, false},
	{"off", EG_HISTORY_OFF, false},
	{NULL, 0, false}
};

/* eventgrid.webhook_request_origin: printable ASCII, at most 255 bytes (it becomes a header). */
static bool
check_request_origin(char **newval, void **extra, GucSource source)
{
	const char *v = *newval;

	if (v == NULL)
		return true;
	if (strlen(v) > 255)
	{
		GUC_check_errdetail("eventgrid.webhook_request_origin may be at most 255 bytes.");
		return false;
	}
	for (; *v; v++)
		if ((unsigned char) *v < 0x20 || (unsigned char) *v >= 0x7f)
		{
			GUC_check_errdetail("eventgrid.webhook_request_origin may hold printable ASCII only.");
			return false;
		}
	return true;
}

/*
 * eventgrid.entra_authority: an https URL (http to 127.0.0.1 or
 * localhost, for tests) of printable ASCII without spaces, at most 400 bytes (the token endpoint of a tenant is
 * made from it: {authority}/{tenant}/oauth2/v2.0/token).
 */
/*
 * Is v "http://" and one of this machine's names (127.0.0.1, localhost,
 * [::1]) as the whole host: then the end, a path, or a port and a path?
 * "http://localhost.example.com" and "http://localhost@elsewhere" are not.
 */
static bool
is_loopback_http(const char *v)
{
	static const char *const hosts[] = {"127.0.0.1", "localhost", "[::1]"};

	if (pg_strncasecmp(v, "http://", 7) != 0)
		return false;
	v += 7;
	for (size_t i = 0; i < lengthof(hosts); i++)
	{
		size_t		n = strlen(hosts[i]);
		const char *rest = v + n;

		if (pg_strncasecmp(v, hosts[i], n) != 0)
			continue;
		if (*rest == ':')
		{
			const char *digits = ++rest;

			while (*rest >= '0' && *rest <= '9')
				rest++;
			if (rest == digits)
				return false;
		}
		return *rest == '\0' || *rest == '/';
	}
	return false;
}

static bool
check_entra_authority(char **newval, void **extra, GucSource source)
{
	const char *v = *newval;

	if (v == NULL)
		return true;
	if (strncmp(v, "https://", 8) != 0 && !is_loopback_http(v))
	{
		GUC_check_errdetail("eventgrid.entra_authority must be an https URL, such as https://login.microsoftonline.com (http only to 127.0.0.1, localhost or [::1], for tests).");
		return false;
	}
	if (strlen(v) > 400)
	{
		GUC_check_errdetail("eventgrid.entra_authority may be at most 400 bytes.");
		return false;
	}
	for (; *v; v++)
		if ((unsigned char) *v <= 0x20 || (unsigned char) *v >= 0x7f || *v == '?' || *v == '#')
		{
			GUC_check_errdetail("eventgrid.entra_authority may hold printable ASCII only, without spaces, a query or a fragment.");
			return false;
		}
	return true;
}

/* eventgrid.ssl_ca_file: empty, or a file the server can read. */
static bool
check_ssl_ca_file(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0')
		return true;
	if (!is_absolute_path(*newval))
	{
		GUC_check_errdetail("eventgrid.ssl_ca_file must be an absolute path.");
		return false;
	}
	if (access(*newval, R_OK) != 0)
	{
		GUC_check_errdetail("File \"%s\" cannot be read: %m.", *newval);
		return false;
	}
	return true;
}

/*
 * The HTTP listener's (SPEC 16, serve/listener.c): all PGC_POSTMASTER, its
 * sockets being opened once, so defined only while the postmaster loads the
 * library.
 */
static void
define_http_gucs(void)
{
	DefineCustomIntVariable("eventgrid.http_port",
							gettext_noop("TCP port on which the HTTP listener serves Event Grid's data plane (publishing over HTTP); 0: no listener."),
							gettext_noop("URLs name the database: {scheme}://{host}:{port}/{database}/topics/{topic}/api/events."),
							&eg_http_port, 0, 0, 65535,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomStringVariable("eventgrid.http_listen_addresses",
							   gettext_noop("Comma-separated IP addresses or host names the HTTP listener binds to; * for every IPv4 address."),
							   NULL, &eg_http_listen_addresses, "127.0.0.1",
							   PGC_POSTMASTER, GUC_LIST_INPUT, NULL, NULL, NULL);
	DefineCustomStringVariable("eventgrid.http_ssl_cert_file",
							   gettext_noop("PEM file of the HTTP listener's certificate (and its chain); with eventgrid.http_ssl_key_file the listener serves HTTPS only."),
							   NULL, &eg_http_ssl_cert_file, "",
							   PGC_POSTMASTER, GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	DefineCustomStringVariable("eventgrid.http_ssl_key_file",
							   gettext_noop("PEM file of the HTTP listener's private key (unencrypted)."),
							   NULL, &eg_http_ssl_key_file, "",
							   PGC_POSTMASTER, GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.http_max_connections",
							gettext_noop("Most client connections the HTTP listener holds at once; more are refused."),
							NULL, &eg_http_max_connections, 100, 1, 10000,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.http_max_requests_in_flight",
							gettext_noop("Most HTTP requests the listener runs in the databases at once, each on a connection of its own; more wait for one to finish."),
							gettext_noop("A waiting receive (long poll) holds one for up to its maxWaitTime."),
							&eg_http_max_requests_in_flight, 32, 1, EG_HTTP_MAX_IN_FLIGHT_LIMIT,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.http_connection_timeout",
							gettext_noop("How long an HTTP client's connection may stay without sending or receiving a byte before the listener closes it."),
							gettext_noop("A slow or idle client holds only its own connection, and at most this long between bytes."),
							&eg_http_connection_timeout_s, 30, 1, 3600,
							PGC_POSTMASTER, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.http_request_timeout",
							gettext_noop("How long an HTTP client has to send a whole request (headers and body), from its connection or its previous answer on; then the listener closes the connection."),
							gettext_noop("A client that sends a byte now and then (slowloris) holds its connection at most this long; a request the database runs (a long poll) is not counted."),
							&eg_http_request_timeout_s, 10, 1, 3600,
							PGC_POSTMASTER, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.http_max_connections_per_address",
							gettext_noop("Most client connections the HTTP listener holds at once from one IP address; more from it are refused."),
							NULL, &eg_http_max_connections_per_address, 32, 1, 10000,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
}

/* Defines eventgrid's GUCs (_PG_init, in every process that loads the library). */
void
eg_define_gucs(void)
{
	/*
	 * A PGC_POSTMASTER variable can only be defined while the postmaster
	 * loads the library; loaded on demand, defining it would be FATAL.  It
	 * only matters to the worker, which exists only when preloaded.
	 */
	if (process_shared_preload_libraries_in_progress)
		DefineCustomStringVariable("eventgrid.database_name",
								   gettext_noop("No longer used: every database where the extension is created is served."),
								   gettext_noop("Kept so that a configuration from before 0.9.0 still loads; the launcher logs once that it is ignored."),
								   &eg_database_name, "postgres",
								   PGC_POSTMASTER, GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("eventgrid.max_databases",
								gettext_noop("Most databases the launcher keeps track of (and so serves) at once."),
								gettext_noop("Each takes a slot of shared memory whether or not it has the extension; databases that do not allow connections and templates are not counted."),
								&eg_max_databases, 1000, 1, 10000,
								PGC_POSTMASTER, 0, NULL, NULL, NULL);
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("eventgrid.delivery_workers",
								gettext_noop("Number of delivery workers per database; they share its queue, each event subscription's position moved by one at a time."),
								gettext_noop("Each worker has its own eventgrid.max_concurrent_requests and eventgrid.max_bytes_in_flight; eventgrid.max_requests_per_endpoint bounds them all together."),
								&eg_delivery_workers, 1, 1, EG_MAX_DELIVERY_WORKERS,
								PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.worker_idle_timeout",
							gettext_noop("How long a database's workers stay with nothing to do before they exit; work brings them back."),
							gettext_noop("While another database waits for a free worker slot, idle workers exit at once."),
							&eg_worker_idle_timeout_s, 120, 1, 24 * 3600,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.max_concurrent_requests",
							gettext_noop("Maximum number of HTTP delivery requests in flight at once."),
							NULL, &eg_max_concurrent_requests, 64, 1, EG_MAX_CONCURRENT_REQUESTS_LIMIT,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.response_timeout",
							gettext_noop("Time an endpoint has to answer a delivery request before the attempt counts as TimedOut."),
							gettext_noop("Event Grid waits 30 seconds."),
							&eg_response_timeout_ms, 30000, 100, 300000,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.retry_jitter_percent",
							gettext_noop("Random extra delay added to each retry step, as a percentage of the step (0 to this value)."),
							NULL, &eg_retry_jitter_percent, 10, 0, 50,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.max_retry_after",
							gettext_noop("Longest Retry-After of an endpoint's answer that delays a retry; longer ones count as this long."),
							gettext_noop("A retry waits for the later of its schedule step and the answer's Retry-After (delta-seconds or HTTP-date), this at most. 0 ignores Retry-After."),
							&eg_max_retry_after_s, 3600, 0, 7 * 24 * 3600,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.clock_offset",
							gettext_noop("Shifts the delivery workers' clock forward, for tests and drills of the retry schedule."),
							gettext_noop("Leave at 0 in production."),
							&eg_clock_offset_s, 0, 0, 400 * 24 * 3600,
							PGC_SIGHUP, GUC_UNIT_S | GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.default_max_events_per_batch",
							gettext_noop("max_events_per_batch used when a subscription sets only preferred_batch_size_in_kilobytes."),
							NULL, &eg_default_max_events_per_batch, 10, 1, 5000,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.default_preferred_batch_size_in_kilobytes",
							gettext_noop("preferred_batch_size_in_kilobytes used when a subscription sets only max_events_per_batch."),
							NULL, &eg_default_preferred_batch_kb, 64, 1, 1024,
							PGC_SIGHUP, GUC_UNIT_KB, NULL, NULL, NULL);
	DefineCustomBoolVariable("eventgrid.delivery_paused",
							 gettext_noop("Pauses delivery: the worker finishes requests in flight and claims nothing new."),
							 gettext_noop("Publishing goes on; deliveries wait and their time-to-live keeps running."),
							 &eg_delivery_paused, false,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("eventgrid.metrics_per_topic",
							 gettext_noop("Makes the per-subscription metric views give one row per topic, so that a Prometheus scrape's series follow the topics."),
							 gettext_noop("event_subscription_metrics, event_subscription_metric_labels and event_subscription_histograms: a domain counts as one topic, event_subscription is empty. Set it for the exporter's role."),
							 &metrics_per_topic, false,
							 PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.max_bytes_in_flight",
							gettext_noop("Memory each delivery worker's deliveries may hold at once (their records, request bodies and headers): claimed, in flight, or awaiting their outcome."),
							gettext_noop("Bounds the worker's memory; an event larger than this still goes, alone."),
							&eg_max_bytes_in_flight_kb, 16 * 1024, 1024, 1024 * 1024,
							PGC_SIGHUP, GUC_UNIT_KB, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.max_requests_per_endpoint",
							gettext_noop("Maximum number of HTTP delivery requests in flight at once to one endpoint host (scheme, host and port)."),
							gettext_noop("Hosts take turns for the free connections; a host that hangs holds at most this many."),
							&eg_max_requests_per_endpoint, 32, 1, 1000,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.probation_failures",
							gettext_noop("Consecutive failed delivery attempts to an endpoint that put it on probation (delayed delivery)."),
							gettext_noop("Event Grid's example: the first 10 events to an endpoint all fail."),
							&eg_probation_failures, 10, 1, 1000,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.event_table_rotation",
							gettext_noop("How long each of the three event tables takes new events before the next one does."),
							gettext_noop("A table is emptied once everything has passed its events, so the queue holds about two of these periods of events."),
							&eg_event_table_rotation_s, 10, 1, 3600,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.event_retention",
							gettext_noop("How long an event table is kept after its turn ended, even when nothing needs its events any more."),
							gettext_noop("For a server whose events delivery servers receive by logical replication: after a failover, what they had not received is fed again from the event tables (README \"Scaling out\"). At most 5/3 of eventgrid.event_table_rotation counts (so the oldest table is still emptied before its next turn); 0 keeps nothing."),
							&eg_event_retention_s, 0, 0, 7200,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.replication_sync_wait",
							gettext_noop("How long a new logical replication slot of this database must have streamed before the event tables stop being kept for its subscriber's initial copy."),
							gettext_noop("A subscriber passes over the rows it is sent until its initial copy of eventgrid.events is done, and the copy starts only once the subscription streams: no event table is emptied while a slot has not streamed this long (README \"Scaling out\")."),
							&eg_replication_sync_wait_s, 300, 1, 86400,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomEnumVariable("eventgrid.attempt_history",
							 gettext_noop("Which delivery attempts the history (view eventgrid.delivery_attempts) keeps: all, failures or off."),
							 gettext_noop("failures keeps every attempt that did not deliver; off keeps none."),
							 &eg_attempt_history, EG_HISTORY_ALL, history_modes,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.attempt_history_retention",
							gettext_noop("How long the delivery attempt history keeps an attempt at least."),
							gettext_noop("Three tables take turns, each for half of this; an attempt is removed between one and one and a half times this after it was made."),
							&eg_attempt_history_retention_s, 24 * 3600, 120, 90 * 24 * 3600,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.attempt_history_max_rows",
							gettext_noop("How many delivery attempts the history keeps at least before the oldest are removed."),
							gettext_noop("A history table takes half of this many rows before the next one does; the history holds at most one and a half times this."),
							&eg_attempt_history_max_rows, 1000000, 1000, INT_MAX,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomStringVariable("eventgrid.webhook_request_origin",
							   gettext_noop("WebHook-Request-Origin of the CloudEvents endpoint validation handshake: who sends the events."),
							   gettext_noop("A DNS name or other printable text of at most 255 bytes; empty sends \"eventgrid\"."),
							   &eg_webhook_request_origin, "",
							   PGC_SIGHUP, 0, check_request_origin, NULL, NULL);
	DefineCustomStringVariable("eventgrid.ssl_ca_file",
							   gettext_noop("PEM file of the certificate authorities HTTPS endpoints and amqps:// brokers are verified against; empty: the system's store."),
							   gettext_noop("Set it for receivers whose certificates a private CA signed. Certificates are always verified."),
							   &eg_ssl_ca_file, "",
							   PGC_SIGHUP, GUC_SUPERUSER_ONLY, check_ssl_ca_file, NULL, NULL);
	DefineCustomStringVariable("eventgrid.entra_authority",
							   gettext_noop("Microsoft Entra ID authority whose token endpoints set_entra_authentication() uses."),
							   gettext_noop("Tokens come from {authority}/{tenant_id}/oauth2/v2.0/token; another cloud's authority (e.g. https://login.microsoftonline.us) or a test server may be set."),
							   &eg_entra_authority, "https://login.microsoftonline.com",
							   PGC_SIGHUP, 0, check_entra_authority, NULL, NULL);
	if (process_shared_preload_libraries_in_progress)
		define_http_gucs();
	DefineCustomStringVariable("eventgrid.debug_pause_points",
							   gettext_noop("Developer option for tests: comma-separated names of pause points where the workers wait while a session holds the point's advisory lock (pause.c)."),
							   gettext_noop("The lock is pg_advisory_lock(1162301520, hashtext(name)) in the worker's database. Empty (the default): no point pauses, at no cost."),
							   &eg_debug_pause_points, "",
							   PGC_SIGHUP, GUC_NOT_IN_SAMPLE | GUC_NO_SHOW_ALL | GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	MarkGUCPrefixReservedCompat("eventgrid");
}

