# Scale in subscriptions (SPEC 20): a delivery worker's claim looks at the
# event subscriptions whose topic or domain topic has new events, and at
# those it kept, not at every position (src/store/store_claim_candidates.c).
#   - the README's example runs as written: 100,000 domain topics'
#     subscriptions made in one statement, an event to one of them goes to
#     its webhook only;
#   - beside those and 3,000 more idle domain-topic subscriptions, the first-attempt claims
#     of a busy topic's events return rows for what has events only:
#     pg_stat_statements (track = all) counts the rows of the workers' own
#     statements; a claim that scanned every position gave 3,001 rows a
#     claim;
#   - every event still reaches every subscription in the cases the
#     candidates must cover: a domain's events spread over a few of its
#     domain topics (theirs and the domain-scope subscription's, no other
#     domain topic's); a subscription whose creating transaction commits
#     after the events it is owed (their transaction was in progress at its
#     snapshot and committed before a claim looked); one resumed after a
#     pause; a rate-limited one whose events wait at its position while the
#     delivery workers are terminated and start again (what they kept is
#     gone: the new ones sweep);
#   - the upkeep's look at what holds an event table and the backlog count
#     read the topics and domain topics the tables hold: the idle domain
#     topics' subscriptions do not keep the tables from being emptied.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP qw(decode_json);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $idle = 3000;
my $node = new_node('scale_subs',
	shared_preload_libraries => "'eventgrid,pg_stat_statements'",
	'pg_stat_statements.track' => "'all'",
	'eventgrid.delivery_workers' => 2,
	'eventgrid.event_table_rotation' => "'2s'");
my $r = start_receiver();
my $u = $r->{url};
sub sql { return $node->safe_psql('postgres', shift) }

sql("CREATE EXTENSION pg_stat_statements");

# --- the README's 100,000-tenant domain, as written ("Scale in subscriptions")
my $readme = slurp_file("$FindBin::RealBin/../../README.md");
my ($example) = $readme =~ /```sql\n(SELECT eventgrid\.create_domain\('saas'\);\n-- a webhook per tenant.*?)```/s;
ok(defined $example, 'the README\'s scale example is found');
$node->safe_psql('postgres', $example, timeout => scaled(600));
is(sql("SELECT count(*) FROM eventgrid.event_subscriptions WHERE topic = 'saas'"), '100000',
	'it made 100,000 domain topics\' subscriptions');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id"
	  . " WHERE s.topic = 'saas' AND s.domain_topic = 'tenant-42' AND r.attempts >= 1", '1', 60),
	'its event went to tenant-42\'s webhook only (an attempt made: the example host does not resolve here)');
is(sql("SELECT count(*) FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id"
	  . " WHERE s.topic = 'saas' AND s.domain_topic <> 'tenant-42'"), '0', 'no other tenant\'s');
sql("SELECT eventgrid.create_topic('busy')");
sql("SELECT eventgrid.create_event_subscription('busy', 'hook', '$u/busy')");
sql("SELECT eventgrid.create_domain('tenants')");
sql("SELECT eventgrid.create_event_subscription('tenants', 'all', '$u/all', max_events_per_batch => 100)");
sql("DO \$\$ BEGIN FOR i IN 1 .. $idle LOOP"
	  . " PERFORM eventgrid.create_event_subscription('tenants/t-' || i, 'hook', '$u/t-' || i); END LOOP; END \$\$");
is(sql("SELECT count(*) FROM eventgrid.event_subscriptions WHERE topic <> 'saas'"), $idle + 2,
	"$idle domain topics' subscriptions beside a busy topic's");
sql("VACUUM ANALYZE");

# --- the busy topic's claims: rows for what has events, whatever the idle subscriptions
sql("SELECT pg_stat_statements_reset()");
sql("SELECT eventgrid.publish('busy', '[" . eg_event("b$_") . "]')") for 1 .. 20;
is(scalar(wait_for_requests($r, '/busy', 20, 60)), 20, 'the busy topic\'s 20 events, published one a transaction, arrived');
my ($calls, $rows) = split /\|/, sql(
	"SELECT coalesce(sum(calls), 0), coalesce(sum(rows), 0) FROM pg_stat_statements"
	  . " WHERE query LIKE '%p.subscription_id = ANY (\$4)%' AND query LIKE '%FOR UPDATE OF p SKIP LOCKED%'");
cmp_ok($calls, '>', 0, "the workers' first-attempt claims ran ($calls) and are counted");
cmp_ok($rows, '<=', 20 + 2 * $calls,
	"they returned $rows rows in all: the busy topic's events and position, none for the " . ($idle + 100000)
	  . " idle subscriptions");
cmp_ok(sql("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE '%AS all_keys%'"),
	'>=', $calls, 'each claim looked for its candidates first');

# --- a domain's events spread over a few of its domain topics
sql("SELECT eventgrid.publish('tenants', (SELECT jsonb_agg(jsonb_build_object('id', 's-' || g, 'subject', '/s',"
	  . " 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'topic', 't-' || (ARRAY[7, 1500, $idle])[g % 3 + 1],"
	  . " 'data', '{}'::jsonb)) FROM generate_series(1, 30) g))");
is(scalar(wait_for_requests($r, "/t-$_", 10, 60)), 10, "domain topic t-$_ got its 10 events") for (7, 1500, $idle);
my @all;
for (1 .. scaled(60) * 10)
{
	@all = map { @{ decode_json($_->{body}) } } requests($r, '/all');
	last if @all >= 30;
	select(undef, undef, undef, 0.1);
}
is(scalar(@all), 30, 'the domain-scope subscription got all 30');
is(scalar(requests($r, '/t-8')) + scalar(requests($r, '/t-1')), 0, 'other domain topics got nothing');

# --- a subscription committed after the events it is owed
sql("SELECT eventgrid.create_topic('late')");
my $pub = $node->background_psql('postgres');
$pub->query_safe("BEGIN; SELECT eventgrid.publish('late', '[" . eg_event('owed') . "]')");
my $creator = $node->background_psql('postgres');
# its snapshot sees the publisher in progress: the event is for it
$creator->query_safe("BEGIN; SELECT eventgrid.create_event_subscription('late', 'sub', '$u/late')");
$pub->query_safe('COMMIT');
$pub->quit;
# a claim looks (and passes the published transaction) before the subscription commits
sql("SELECT eventgrid.publish('busy', '[" . eg_event('b21') . "]')");
is(scalar(wait_for_requests($r, '/busy', 21, 60)), 21, 'a claim ran after the publisher committed');
# and the rotation comes to the event's table (no committed subscription
# is owed it): the uncommitted subscription's lock keeps it (emptied, the
# event was lost to the subscription: seen in a run of the suite under load)
my $owed_table = sql("SELECT event_table FROM eventgrid.events WHERE topic = 'late'");
my $since = sql("SELECT clock_timestamp()");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.event_tables WHERE event_table = '$owed_table' AND NOT current"
	  . " AND last_try_at > '$since' AND last_failure = 'another session holds a lock on the table'", '1', 60),
	'the rotation left the table of the owed event: the creating transaction holds it');
$creator->query_safe('COMMIT');
$creator->quit;
my @late = wait_for_requests($r, '/late', 1, 60);
is(scalar(@late), 1, 'the event of the transaction in progress at the subscription\'s snapshot reached it');
# a REPEATABLE READ transaction took its snapshot before its call took the
# lock: when an event table was emptied in between, what the subscription
# was owed may be gone, and it is refused
my $rr = $node->background_psql('postgres', on_error_stop => 0);
$rr->query_safe("\\set VERBOSITY verbose");
$rr->query_safe("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM eventgrid.topics");
my $snapshot_at = sql("SELECT clock_timestamp()");
sql("SELECT eventgrid.publish('busy', '[" . eg_event('b22') . "]')");
ok(wait_for_sql($node, "SELECT count(*) > 0 FROM eventgrid.event_tables WHERE truncated_at > '$snapshot_at'", 't', 60),
	'an event table was emptied after the snapshot');
$rr->query("SELECT eventgrid.create_event_subscription('late', 'repeatable', '$u/rr')");
like($rr->{stderr}, qr/ERROR:  40001: an event table was emptied after this transaction's snapshot was taken/,
	'REPEATABLE READ: create_event_subscription() after an emptied event table is a serialization failure (40001)');
$rr->quit;
is(sql("SELECT count(*) FROM eventgrid.event_subscriptions WHERE topic = 'late'"), '1', 'and nothing of it is left');

# --- resumed after a pause
sql("SELECT eventgrid.pause_delivery('tenants/t-42', 'hook')");
sql("SELECT eventgrid.publish('tenants', '[" . eg_event('p1', topic => 't-42') . "]')");
sleep(scaled(1));
is(scalar(requests($r, '/t-42')), 0, 'nothing is delivered to a paused domain topic subscription');
# --- what is pending, among 200,000 subscriptions: computed for those that may
# have something (the paused one's event; saas/tenant-42's retry), the same as
# each subscription's own backlog
ok(wait_for_sql($node, "SELECT string_agg(topic || '/' || coalesce(domain_topic, '') || '=' || pending, ',' ORDER BY topic)
          FROM eventgrid.delivery_statistics WHERE pending > 0 AND topic IN ('tenants', 'saas')",
	'saas/tenant-42=1,tenants/t-42=1', 30), 'delivery_statistics: the paused subscription\'s event and the retry are pending');
# read in the same statement as delivery_statistics: the workers keep
# delivering (busy, late, the retry's attempts), and two reads straddle them
my $differ = "SELECT coalesce(string_agg(k || '/' || n || ': ' || coalesce(d.pending, 0) || ' vs ' || coalesce(m.pending, 0), ', '), '')
                FROM (SELECT topic || coalesce('/' || domain_topic, '') AS k, subscription AS n, pending
                        FROM eventgrid.delivery_statistics WHERE pending > 0) d
                FULL JOIN (SELECT topic AS k, event_subscription AS n, pending_events AS pending
                             FROM eventgrid.event_subscription_metrics WHERE pending_events > 0) m USING (k, n)
               WHERE d.pending IS DISTINCT FROM m.pending";
is(sql($differ), '', 'event_subscription_metrics: each subscription\'s pending_events is delivery_statistics\' pending');
is(sql("SELECT count(*) FROM eventgrid.event_subscriptions s
         WHERE (s.id IN (SELECT id FROM eventgrid.event_subscriptions ORDER BY random() LIMIT 300)
                OR s.read_key IN ('saas/tenant-42', 'tenants/t-42', 'busy'))
           AND eventgrid._pending(s.id) <> (SELECT d.pending FROM eventgrid.delivery_statistics d
                                             WHERE d.topic = s.topic AND d.subscription = s.name
                                               AND d.domain_topic IS NOT DISTINCT FROM s.domain_topic)"),
	'0', 'for 300 subscriptions at random and those with events, the view\'s pending is the subscription\'s own backlog');
is(sql("SET eventgrid.metrics_per_topic = on;
        SELECT string_agg(topic || '/' || event_subscription || '=' || pending_events || '/' || paused, ',' ORDER BY topic)
          FROM eventgrid.event_subscription_metrics WHERE topic IN ('saas', 'tenants')"),
	'saas/=1/0,tenants/=1/0', 'per topic: one row a domain, its pending events summed, those of paused subscriptions too');
is(sql("SET eventgrid.metrics_per_topic = on; SELECT count(*) FROM eventgrid.event_subscription_histograms"),
	sql("SELECT 32 * count(DISTINCT topic) FROM eventgrid.event_subscriptions"),
	'per topic: 32 buckets a topic, not a subscription');
sql("SELECT eventgrid.resume_delivery('tenants/t-42', 'hook')");
is(scalar(wait_for_requests($r, '/t-42', 1, 60)), 1, 'resumed, its event arrives');

# --- a rate-limited subscription's events wait at its position; its workers are replaced meanwhile
sql("SELECT eventgrid.create_event_subscription('tenants/t-99', 'slow', '$u/slow', max_events_per_second => 4)");
sql("SELECT eventgrid.publish('tenants', (SELECT jsonb_agg(jsonb_build_object('id', 'r-' || g, 'subject', '/r',"
	  . " 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'topic', 't-99', 'data', '{}'::jsonb))"
	  . " FROM generate_series(1, 16) g))");
ok(wait_for_requests($r, '/slow', 2, 30) >= 2, 'the rate-limited subscription is being served');
sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'");
is(scalar(wait_for_requests($r, '/slow', 16, 90)), 16,
	'all 16 arrived: the positions the terminated workers kept were found again');
is(scalar(requests($r, '/t-99')), 16, 'and t-99\'s own subscription got them too');

# --- the idle subscriptions hold no event table
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.events", '0', 60),
	'every event table was emptied: the idle domain topics\' subscriptions hold none');
is(sql("SELECT count(*) FROM eventgrid.event_tables WHERE waiting_for IS NOT NULL AND cardinality(waiting_for) > 0"), '0',
	'event_tables names nothing that holds a table');

done_testing();
