# pg_dump / pg_restore keeps everything (issue "Trust", item 5): topics,
# event subscriptions, delivery properties with secrets, the topics' access
# keys, queued events and their deliveries, dead letters, counters and
# identity sequences.  The
# restored database is delivered from, with secrets intact, and new events
# get ids that do not collide with restored ones.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('dump');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q) }

sql('postgres', "SELECT eventgrid.create_topic('shop')");
sql('postgres', "SELECT eventgrid.create_event_subscription('shop', 'billing', '$u/status/200/billing')");
sql('postgres', "SELECT eventgrid.set_delivery_property('shop', 'billing', 'X-Secret', 's3cret', is_secret => true)");
sql('postgres', "SELECT eventgrid.set_dynamic_delivery_property('shop', 'billing', 'X-Order', 'data.orderId')");
sql('postgres', "SELECT eventgrid.create_event_subscription('shop', 'refusing', '$u/status/400/refusing', deadletter => true)");
# a namespace topic, and a subscription with advanced filters (0.4.0)
sql('postgres', "SELECT eventgrid.create_topic('ns-shop', 'CloudEventSchemaV1_0', topic_type => 'namespace')");
sql('postgres', "SELECT eventgrid.create_event_subscription('ns-shop', 'ns-sub', '$u/status/200/ns', max_delivery_count => 3,"
	  . " event_time_to_live => 'P1DT2H', advanced_filters => '[{\"operatorType\": \"NumberIn\", \"key\": \"data.n\", \"values\": [1, 2]}]',"
	  . " enable_advanced_filtering_on_arrays => true, expiration_time => '2100-01-01 00:00:00+00')");
# an event domain with a domain topic's subscription (0.20.0)
sql('postgres', "SELECT eventgrid.create_domain('tenants')");
sql('postgres', "SELECT eventgrid.create_event_subscription('tenants/t-one', 'hook', '$u/status/200/t-one')");
# a WAL source (0.23.0) with a table mapping, and a reject
my ($app, $conn) = source_cluster('app', 'CREATE TABLE public.orders (id int PRIMARY KEY); CREATE PUBLICATION app_pub FOR TABLE public.orders');
sql('postgres', "SELECT eventgrid.create_topic('app-orders')");
sql('postgres', "SELECT eventgrid.create_event_subscription('app-orders', 'hook', '$u/status/200/app-orders')");
sql('postgres', "BEGIN; SELECT eventgrid.create_wal_source('app', '$conn', 'app_pub');"
	  . " SELECT eventgrid.publish_table_changes('public.orders', 'app-orders', source => 'app'); COMMIT;");
ok(wait_for_sql($node, "SELECT state FROM eventgrid.wal_sources", 'streaming'), 'a WAL source streams before the dump');
$app->safe_psql('postgres', "INSERT INTO public.orders VALUES (1); SELECT pg_logical_emit_message(false, 'eventgrid', 'x')");
is(scalar(wait_for_requests($r, '/status/200/app-orders', 1)), 1, 'its table change is delivered');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.wal_source_rejects", '1'), 'and its reject recorded');
my $wal_sources = "SELECT string_agg(concat_ws(' ', w.name, w.connection, w.publication, w.slot_name, m.table_name, m.topic,"
  . " (SELECT string_agg(reason, ',') FROM eventgrid.wal_source_rejects)), ';')"
  . " FROM eventgrid.wal_sources w JOIN eventgrid.wal_source_definitions d USING (name) JOIN eventgrid.wal_source_tables m ON m.source_id = d.id";
my $wal_sources_before = sql('postgres', $wal_sources);
ok(wait_for_sql($node, "SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics", '0'), 'nothing pending');

my $profile = "SELECT string_agg(concat_ws(' ', t.name, t.topic_type, s.name, s.max_delivery_count, s.event_time_to_live,"
  . " s.advanced_filters, s.enable_advanced_filtering_on_arrays, s.expiration_time AT TIME ZONE 'UTC'), '; ' ORDER BY s.id)"
  . " FROM eventgrid.event_subscriptions s JOIN eventgrid.topics t ON t.name = s.topic";
my $profile_before = sql('postgres', $profile);
like($profile_before, qr/ns-shop namespace ns-sub 3 P1DT2H \[\{.*NumberIn.*\}\] t 2100-01-01 00:00:00; tenants custom hook f; app-orders custom hook f$/,
	'namespace profile, advanced filters and expiration time (0.19.0) before the dump');
sql('postgres', "SELECT eventgrid.publish('shop', '[" . join(',', map { eg_event("before-$_") } 1 .. 3) . "]')");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters", '3'), 'three dead letters before the dump');
ok(wait_for_sql($node, "SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics", '0'), 'nothing pending before the dump');

# queue ten events while delivery is paused
sql('postgres', "ALTER SYSTEM SET eventgrid.delivery_paused = on; SELECT pg_reload_conf()");
sleep 1;
sql('postgres', "SELECT eventgrid.publish('shop', '[" . join(',', map { eg_event("queued-$_") } 1 .. 10) . "]')");
sql('postgres', "SELECT eventgrid.publish('tenants', '[" . eg_event('tenant-1', topic => 't-one') . "," . eg_event('tenant-2', topic => 't-two') . "]')");
my $snapshot = "SELECT (SELECT count(*) FROM eventgrid.topics) || '/' || (SELECT count(*) FROM eventgrid.event_subscriptions)"
  . " || '/' || (SELECT count(*) FROM eventgrid.delivery_properties) || '/' || (SELECT sum(pending) FROM eventgrid.delivery_statistics)"
  . " || '/' || (SELECT count(*) FROM eventgrid.retries) || '/' || (SELECT count(*) FROM eventgrid.dead_letters)"
  . " || '/' || (SELECT sum(dead_lettered) FROM eventgrid.subscription_counters)";
my $before = sql('postgres', $snapshot);
is($before, '4/5/2/21/0/3/3', 'configuration, queue and dead letters before the dump');
my $history = "SELECT count(*) || '/' || string_agg(DISTINCT outcome, ',' ORDER BY outcome) FROM eventgrid.delivery_attempts";
my $history_before = sql('postgres', $history);
like($history_before, qr{^[1-9]\d*/}, "attempt history before the dump ($history_before)");
my $max_event_id = sql('postgres', 'SELECT max(id) FROM eventgrid.events');
my $domains = "SELECT (SELECT string_agg(d.name || ':' || d.auto_create_topic_with_first_subscription, ',') FROM eventgrid.domains d)"
  . " || ' ' || (SELECT string_agg(domain || '/' || domain_topic || ':' || subscriptions || ':' || created_automatically, ',')"
  . "            FROM eventgrid.domain_topics)"
  . " || ' ' || (SELECT string_agg(coalesce(domain_topic, '-'), ',' ORDER BY id) FROM eventgrid.events WHERE topic = 'tenants')";
my $domains_before = sql('postgres', $domains);
is($domains_before, 'tenants:true tenants/t-one:1:true t-one,t-two', 'a domain, its domain topic and routed events before the dump');
# the topics' access keys for HTTP publishers (0.18.0): one replaced, so that a fresh key would differ
sql('postgres', "SELECT eventgrid.regenerate_topic_key('shop', 'key2')");
my $keys = "SELECT string_agg(topic || ' ' || key1 || ' ' || key2 || ' ' || key2_set_at, ',' ORDER BY topic) FROM eventgrid.topic_keys";
my $keys_before = sql('postgres', $keys);

my $dump = "$PostgreSQL::Test::Utils::tmp_check/eventgrid.dump";
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ], 'pg_dump -Fc');

# every database is served: the dumped one keeps its queue to itself, so that
# what reaches the receiver is the restored database's
sql('postgres', "SELECT eventgrid.pause_delivery('shop', 'billing')");
sql('postgres', "SELECT eventgrid.pause_delivery('tenants')");
# and a WAL source moves: its slot is read by one database at a time
sql('postgres', "SELECT eventgrid.pause_wal_source('app')");

# the worker moves to the new database: eventgrid.database_name, then restart
$node->append_conf('postgresql.conf', "eventgrid.database_name = 'restored'\n");
$node->restart;
sql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ], 'pg_restore into a new database');

is(sql('restored', $snapshot), $before, 'everything restored: topics, subscriptions, properties, positions and pending deliveries, dead letters, counters');
is(sql('restored', "SELECT value FROM eventgrid.delivery_properties WHERE is_secret"), 's3cret', 'the secret value is intact');
is(sql('restored', $keys), $keys_before, 'the topics\' access keys are restored as they were');
is(sql('restored', $history), $history_before, 'the attempt history restored');
is(sql('restored', $domains), $domains_before, 'domains, domain topics and the events\' domain topics restored');
is(sql('restored', $profile), $profile_before, 'topic types, namespace retry policies, advanced filters and expiration times restored');
is(sql('restored', "SELECT count(*) FROM eventgrid.dead_letter_events WHERE dead_letter_reason = 'NonRetriableError'"), '3',
	'dead letters read as before');

sql('restored', "ALTER SYSTEM SET eventgrid.delivery_paused = off; SELECT pg_reload_conf()");
my @got = wait_for_requests($r, '/status/200/billing', 13, 60);
my @queued = grep { $json->decode($_->{body})->[0]{id} =~ /^queued-/ } @got;
my @tenant = wait_for_requests($r, '/status/200/t-one', 1, 60);
is(join(',', map { $json->decode($_->{body})->[0]{id} . ' ' . $json->decode($_->{body})->[0]{topic} } @tenant),
	'tenant-1 /domains/tenants/topics/t-one', 'the restored domain topic\'s subscription gets its event only');
is(scalar @queued, 10, 'the restored queue is delivered');
ok(!(grep { ($_->{headers}{'x-secret'} // '') ne 's3cret' } @queued), 'with the secret header intact');
ok(!(grep { !defined $_->{headers}{'x-order'} } @queued), 'and the dynamic header');
ok(wait_for_sql($node, "SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics", '0', 60, 'restored'), 'nothing left in the restored queue');

# new events continue the restored identity sequences
sql('restored', "SELECT eventgrid.publish('shop', '" . eg_event('after-1') . "')");
cmp_ok(sql('restored', "SELECT pg_sequence_last_value('eventgrid.events_id_seq')"), '>', $max_event_id,
	'new event ids follow the restored ones');
ok(scalar(grep { $json->decode($_->{body})->[0]{id} eq 'after-1' } wait_for_requests($r, '/status/200/billing', 14, 30)),
	'a new event is delivered from the restored database');

# the WAL source: its definition (with the password its connection needs), mapping and rejects; it streams from the restored database
is(sql('restored', $wal_sources), $wal_sources_before, 'the WAL source, its table mapping and its rejects restored');
ok(wait_for_sql($node, "SELECT state FROM eventgrid.wal_sources", 'streaming', 60, 'restored'),
	'the restored WAL source connects (its password restored) and streams');
$app->safe_psql('postgres', 'INSERT INTO public.orders VALUES (2)');
my $from_restored = 0;
for (1 .. scaled(60) * 10)
{
	last if $from_restored = grep { $_->{subject} eq '/public/orders/2' } received_events($r, '/status/200/app-orders');
	select(undef, undef, undef, 0.1);
}
ok($from_restored, 'a change on the source after the restore is published from the restored database');

$node->stop;
done_testing();
