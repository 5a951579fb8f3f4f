# Delivery apart from the application's primary, over PostgreSQL's own
# logical replication (issue "Outgrowing one server", README "Scaling out").
#
# Four real clusters on one machine: an application cluster publishing to
# four topics (INSERT, publish(), table changes) across several event-table
# rotations, with no event subscription of its own; two delivery servers
# splitting its topics by publication row filters (one made with
# eventgrid.create_event_publication(), one with the standard CREATE
# PUBLICATION command); a second application cluster fanning in to the
# first delivery server.  Every event is counted at a real receiver, per
# event subscription.  Then the faults: kill -9 of a delivery server while
# it delivers, a restart of the application's server, a delivery server
# down for a while (the slot keeps WAL, the backlog drains, the lag is
# shown), and a failover of the application's primary to a physical standby
# with the documented re-feed.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use File::Spec;
use HTTP::Tiny;
use IPC::Run;
use Test::More;
use Time::HiRes qw(usleep);

my %conf = (
	'eventgrid.event_table_rotation' => "'3s'",
	'eventgrid.replication_sync_wait' => "'5s'",    # the subscriptions' slots keep the event tables this long
	max_worker_processes => 16,
	max_logical_replication_workers => 8,
	restart_after_crash => 'on');
# an application cluster: wal_level logical, replication connections allowed
sub app_node
{
	my ($name, %more) = @_;
	my %all = (%conf, shared_preload_libraries => "'eventgrid'", %more);
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(allows_streaming => 'logical');
	$node->append_conf('postgresql.conf', join('', map { "$_ = $all{$_}\n" } sort keys %all));
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION eventgrid');
	return $node;
}
# the failover re-feed below reaches back eventgrid.event_retention (at most 5/3 of the rotation)
my $app = app_node('app', 'eventgrid.event_table_rotation' => "'6s'", 'eventgrid.event_retention' => "'9s'",
	'eventgrid.worker_idle_timeout' => "'1s'");
my $app2 = app_node('app2');
my $d1 = new_node('delivery1', %conf);
my $d2 = new_node('delivery2', %conf);
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

# ids that arrived at a path, each with how often
sub arrivals
{
	my %seen;
	for my $req (requests($r, shift))
	{
		$seen{ $_->{id} }++ for @{ $json->decode($req->{body}) };
	}
	return \%seen;
}

# waits until every id in @$ids arrived at $path (at most $secs seconds)
sub all_arrived
{
	my ($path, $ids, $secs) = @_;
	my $seen;
	for (1 .. ($secs // 60) * 10)
	{
		$seen = arrivals($path);
		return $seen unless grep { !$seen->{$_} } @$ids;
		usleep(100_000);
	}
	diag("missing at $path: " . join(' ', grep { !$seen->{$_} } @$ids));
	return $seen;
}

# a connection string for CREATE SUBSCRIPTION
sub conninfo
{
	my $node = shift;
	return sprintf('host=%s port=%d dbname=postgres', $node->host, $node->port);
}

sub publish
{
	my ($node, $topic, @ids) = @_;
	my $events = '[' . join(',', map { eg_event($_) } @ids) . ']';
	return $node->safe_psql('postgres', "SELECT eventgrid.publish('$topic', '$events')");
}

# --- set-up: topics on both sides, publications, subscriptions -----------
$app->safe_psql('postgres', q{
	SELECT eventgrid.create_topic(t) FROM unnest(ARRAY['tp1', 'tp2', 'tp3', 'tp4']) t;
	CREATE TABLE orders (id int PRIMARY KEY, amount int);
	SELECT eventgrid.publish_table_changes('orders', 'tp4', ARRAY['INSERT']);
	SELECT eventgrid.create_event_publication('pub_12', ARRAY['tp1', 'tp2']);
	CREATE PUBLICATION pub_34 FOR TABLE eventgrid.events (id, topic, event, publish_time, event_bytes)
	    WHERE (topic IN ('tp3', 'tp4')) WITH (publish = 'insert', publish_via_partition_root = true);
});

# publications that would replicate the rotation's TRUNCATE, or the event
# tables one by one, are refused
my ($ret, $out, $err) = $app->psql('postgres', 'CREATE PUBLICATION bad FOR TABLE eventgrid.events');
like($err, qr/publication "bad" of eventgrid.events must publish inserts only.*HINT:.*publish = 'insert'/s,
	'a publication of eventgrid.events with the default options is refused, with the command to use');
($ret, $out, $err) = $app->psql('postgres', "ALTER PUBLICATION pub_34 SET (publish = 'insert, truncate')");
like($err, qr/must publish inserts only/, 'ALTER PUBLICATION adding TRUNCATE is refused');
($ret, $out, $err) = $app->psql('postgres',
	"CREATE PUBLICATION bad FOR TABLE eventgrid.events WITH (publish = 'insert')");
like($err, qr/through the partitioned table/, 'publishing the event tables one by one is refused');
($ret, $out, $err) = $app->psql('postgres', "SELECT eventgrid.create_event_publication('x', ARRAY['nope'])");
like($err, qr/topic 'nope' does not exist/, 'create_event_publication names an unknown topic');

$d1->safe_psql('postgres', qq{
	SELECT eventgrid.create_topic(t) FROM unnest(ARRAY['tp1', 'tp2']) t;
	SELECT eventgrid.create_event_subscription('tp1', 'sub1', '$u/d1/s1', max_events_per_batch => 5);
	SELECT eventgrid.create_event_subscription('tp1', 'sub1b', '$u/d1/s1b', subject_ends_with => '-0');
	SELECT eventgrid.create_event_subscription('tp2', 'sub2', '$u/d1/s2');
});
$d2->safe_psql('postgres', qq{
	SELECT eventgrid.create_topic(t) FROM unnest(ARRAY['tp3', 'tp4']) t;
	SELECT eventgrid.create_event_subscription('tp3', 'sub3', '$u/d2/s3');
	SELECT eventgrid.create_event_subscription('tp4', 'sub4', '$u/d2/s4');
});
my $app_conn = conninfo($app);
$d1->safe_psql('postgres', "CREATE SUBSCRIPTION sub_app CONNECTION '$app_conn' PUBLICATION pub_12");
$d2->safe_psql('postgres', "CREATE SUBSCRIPTION sub_app34 CONNECTION '$app_conn' PUBLICATION pub_34");

# --- the application publishes across several rotations ------------------
my (%want, @s1b);
my $order = 0;
for my $round (1 .. 8)
{
	my @sql = ('BEGIN;');
	for my $t (1 .. 4)
	{
		for my $i (0 .. 1)
		{
			my $id = "r$round-tp$t-$i";
			push @{ $want{"tp$t"} }, $id;
			push @s1b, $id if $t == 1 && $i == 0;
			push @sql, "INSERT INTO eventgrid.events (topic, event) VALUES ('tp$t', '" . eg_event($id) . "');";
		}
	}
	$order++;
	push @sql, "INSERT INTO orders VALUES ($order, $round);", 'COMMIT;';
	$app->safe_psql('postgres', join("\n", @sql));
	my $id = "p$round";
	publish($app, 'tp2', $id);
	push @{ $want{tp2} }, $id;
	usleep(900_000);
}
my $n_t4 = scalar @{ $want{tp4} };

my $seen = all_arrived('/d1/s1', $want{tp1});
is(scalar(grep { $seen->{$_} == 1 } @{ $want{tp1} }), scalar @{ $want{tp1} },
	'delivery server 1: every tp1 event delivered once to s1 (batches of 5)');
is(scalar(keys %$seen), scalar @{ $want{tp1} }, 'and nothing else');
$seen = all_arrived('/d1/s1b', \@s1b);
is(join(',', sort keys %$seen), join(',', sort @s1b), "s1b's filter took only its events");
$seen = all_arrived('/d1/s2', $want{tp2});
is(scalar(keys %$seen), scalar @{ $want{tp2} }, 'every tp2 event (INSERT and publish()) delivered to s2');
$seen = all_arrived('/d2/s3', $want{tp3});
is(scalar(keys %$seen), scalar @{ $want{tp3} }, 'delivery server 2: every tp3 event delivered');
ok(wait_for_sql($d2, "SELECT count(*) FROM eventgrid.delivery_statistics WHERE subscription = 'sub4' AND delivered = "
		  . ($n_t4 + $order), '1'),
	'every tp4 event, table changes included, delivered by delivery server 2');
# each server lacks the other's topics: an event of them would be counted there
is($d1->safe_psql('postgres', 'SELECT count(*) FROM eventgrid.unknown_topic_events')
	  . $d2->safe_psql('postgres', 'SELECT count(*) FROM eventgrid.unknown_topic_events'),
	'00', "row filters: each delivery server received only its share of the topics");

# the application's primary delivers nothing; its event tables still rotate
is($app->safe_psql('postgres', 'SELECT count(*) FROM eventgrid.delivery_attempts'), '0',
	'the application server made no delivery attempt');
ok(wait_for_sql($app, 'SELECT delivery_workers_running FROM eventgrid.worker_metrics', '0', 30),
	"the application server's delivery worker left");
publish($app, 'tp1', 'quiet-1');
# a delivery worker started would stay for its idle timeout (1 s): look every 100 ms for 2 s
my ($delivery_seen, $upkeep_seen) = (0, 0);
for (1 .. 20)
{
	my ($d, $k) = split /\|/, $app->safe_psql('postgres',
		'SELECT delivery_workers_running, upkeep_workers_running FROM eventgrid.worker_metrics');
	$delivery_seen ||= $d;
	$upkeep_seen ||= $k;
	usleep(100_000);
}
is("$delivery_seen/$upkeep_seen", '0/1',
	'a commit that publishes in a database with no event subscription starts its upkeep worker, no delivery worker');
ok(wait_for_sql($app, 'SELECT count(truncated_at) >= 2 FROM eventgrid.event_tables', 't', 30),
	"the application server's event tables rotate while slots are subscribed");
ok($d1->safe_psql('postgres', 'SELECT count(truncated_at) FROM eventgrid.event_tables') >= 1,
	"delivery server 1's event tables rotate");

# --- fan-in: a second application cluster feeds delivery server 1 --------
$app2->safe_psql('postgres', q{
	SELECT eventgrid.create_topic('tp1');
	SELECT eventgrid.create_topic('tp9');
	SELECT eventgrid.create_event_publication('pub_all');
});
$d1->safe_psql('postgres',
	"SELECT eventgrid.create_event_subscription('tp1', 'dead', '$u/status/400', deadletter => true)");
$d1->safe_psql('postgres', "CREATE SUBSCRIPTION sub_app2 CONNECTION '" . conninfo($app2)
	  . "' PUBLICATION pub_all");
# the same event id from both applications
my $id1 = publish($app, 'tp1', 'same-1') =~ s/[{}]//gr;
my $id2 = publish($app2, 'tp1', 'same-1') =~ s/[{}]//gr;
publish($app2, 'tp9', 'nine-1', 'nine-2');    # a topic delivery server 1 does not have
# a row no publish would write (the publishing server's owner can): a topic no topic could have
$app2->safe_psql('postgres', "INSERT INTO eventgrid.events (topic, event, publish_time, event_bytes)"
	  . " VALUES (repeat('x', 5000), '{}', now(), 2)");
publish($app2, 'tp1', 'after-9');
$seen = all_arrived('/d1/s1', [ 'same-1', 'after-9' ]);
is($seen->{'same-1'}, 2, 'the same event id from two applications is delivered once per source');
ok($seen->{'after-9'}, 'an event for an unknown topic did not stop replication');
ok(wait_for_sql($d1, "SELECT string_agg(format('%s:%s', source, source_event_id), ',' ORDER BY source)"
		  . " FROM eventgrid.dead_letters WHERE event->>'id' = 'same-1'", "sub_app:$id1,sub_app2:$id2"),
	'dead letters tell the sources apart (subscription and the id on the publishing server)');
is($d1->safe_psql('postgres', "SELECT count(DISTINCT event_id) FROM eventgrid.dead_letters WHERE event->>'id' = 'same-1'"),
	'2', 'and the two events have ids of their own on the delivery server');
is($d1->safe_psql('postgres', "SELECT string_agg(DISTINCT source, ',' ORDER BY source) FROM eventgrid.dead_letter_events"),
	'sub_app,sub_app2', 'dead_letter_events shows the source');
is($d1->safe_psql('postgres', "SELECT string_agg(DISTINCT s, ',' ORDER BY s) FROM eventgrid.delivery_attempts a,"
		  . " unnest(a.event_ids, a.event_sources) x(id, s) WHERE a.subscription = 'dead'"),
	'sub_app,sub_app2', 'the attempt history names the source of each event');
is($d1->safe_psql('postgres', "SELECT count(*) FROM eventgrid.delivery_attempts WHERE event_sources IS NOT NULL"
		  . " AND cardinality(event_sources) <> cardinality(event_ids)"), '0',
	'one source per event id');
is($d1->safe_psql('postgres', 'SELECT string_agg(format(\'%s|%s|%s\', source, topic, events), \',\' ORDER BY topic)'
		  . ' FROM eventgrid.unknown_topic_events'),
	'sub_app2|(not a topic name)|1,sub_app2|tp9|2', 'events for a topic the delivery server lacks are counted, not an apply error');
is($d1->safe_psql('postgres',
		"SELECT string_agg(source || ':' || (apply_pid IS NOT NULL) || ':' || unknown_topic_events, ',' ORDER BY source)"
		  . ' FROM eventgrid.replication_sources'),
	'sub_app:true:0,sub_app2:true:3', 'replication_sources shows both feeds');
like($d1->safe_psql('postgres', "SELECT activity FROM eventgrid.worker_status WHERE worker LIKE '%sub_app2'"),
	qr/applies events; last applied at/, 'worker_status shows the apply workers');

# --- faults -----------------------------------------------------------------
# kill -9 of delivery server 1's delivery worker and apply worker while
# they work: the postmaster ends every process and recovers from the WAL
# (a crash of the server as a whole), replication resumes from the origin
# position recovered with it
my @k;
for my $b (1 .. 20)
{
	my @ids = map { "k$b-$_" } 1 .. 10;
	push @k, @ids;
	publish($app, 'tp1', @ids);
	if ($b == 6)
	{
		my $pids = $d1->safe_psql('postgres',
			"SELECT string_agg(pid::text, ' ') FROM eventgrid.worker_status"
			  . " WHERE pid IS NOT NULL AND (worker LIKE 'delivery%' OR worker LIKE '%sub_app')");
		kill 'KILL', split / /, $pids;
	}
}
ok(wait_for_sql($d1, "SELECT count(*) FROM eventgrid.replication_sources WHERE apply_pid IS NOT NULL", '2', 60),
	'after the crash, both apply workers run again');
$seen = all_arrived('/d1/s1', \@k, 90);
is(scalar(grep { $seen->{$_} } @k), scalar @k, 'kill -9 of the delivery server: every event delivered');
my $again = grep { $seen->{$_} > 1 } @k;
cmp_ok($again, '<=', 50, "sent again: only what was in flight ($again)");

# a restart of the application's server
my @rs = map { "rs-$_" } 1 .. 5;
publish($app, 'tp1', @rs[0 .. 1]);
$app->restart;
publish($app, 'tp1', @rs[2 .. 4]);
$seen = all_arrived('/d1/s1', \@rs);
is(scalar(grep { $seen->{$_} == 1 } @rs), 5, "restart of the application's server: each event delivered once");

# delivery server 2 down for a while: its slot keeps WAL, the backlog drains
$d2->stop;
my $down_from = $app->safe_psql('postgres', 'SELECT pg_current_wal_lsn()');
my @down = map { "down-$_" } 1 .. 30;
publish($app, 'tp3', @down[0 .. 14]);
publish($app, 'tp3', @down[15 .. 29]);
# (a rare loss here was once blamed on the slot skipping a transaction: if
# one is ever missing below, this says whether the slot had confirmed past
# its commit before the delivery server came back)
is($app->safe_psql('postgres', "SELECT confirmed_flush_lsn <= '$down_from' FROM pg_replication_slots WHERE slot_name = 'sub_app34'"),
	't', "the slot's confirmed_flush_lsn is below the commits of the events published while the delivery server was down");
is($app->safe_psql('postgres',
		"SELECT NOT active AND lag_bytes > 0 AND retained_bytes > 0 FROM eventgrid.replication_slots WHERE slot_name = 'sub_app34'"),
	't', 'while the delivery server is down, its slot is inactive and keeps WAL (replication_slots)');
sleep 2;
$d2->start;
$seen = all_arrived('/d2/s3', \@down);
is(scalar(grep { $seen->{$_} == 1 } @down), 30, 'the backlog drains when it returns, each event once');
my $lag = $d2->safe_psql('postgres', 'SELECT apply_lag_seconds FROM eventgrid.replication_sources');
cmp_ok($lag, '>=', 2, 'replication_sources shows the lag of what it applied late');

# the same through Debian's prometheus-postgres-exporter with monitoring/'s queries, as a pg_monitor role
my $monitoring = File::Spec->rel2abs("$FindBin::RealBin/../../monitoring");
my %scraped;
for my $node ($d2, $app)
{
	$node->safe_psql('postgres', 'CREATE ROLE exporter LOGIN IN ROLE pg_monitor');
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my ($out, $err) = ('', '');
	my $exporter = IPC::Run::start(
		[ 'env', sprintf('DATA_SOURCE_NAME=host=%s port=%d user=exporter dbname=postgres sslmode=disable',
				$node->host, $node->port),
			'prometheus-postgres-exporter', "--web.listen-address=127.0.0.1:$port",
			"--extend.query-path=$monitoring/postgres_exporter.yml",
			'--auto-discover-databases', '--include-databases=postgres' ],
		'>', \$out, '2>', \$err);
	for (1 .. 100)
	{
		my $res = HTTP::Tiny->new(timeout => 5)->get("http://127.0.0.1:$port/metrics");
		if ($res->{success} && $res->{content} =~ /^eventgrid_replication/m)
		{
			$scraped{ $node->name } = $res->{content};
			last;
		}
		usleep(200_000);
	}
	$exporter->kill_kill;
}
my ($scraped_lag) = ($scraped{delivery2} // '') =~ /^eventgrid_replication_apply_lag_seconds\{[^}]*source="sub_app34"[^}]*\} (\S+)$/m;
ok(defined $scraped_lag && abs($scraped_lag - $lag) < 0.001, "the exporter shows the delivery server's apply lag ($lag)");
like($scraped{delivery2} // '', qr/^eventgrid_replication_apply_running\{[^}]*source="sub_app34"[^}]*\} 1$/m,
	'and that its apply worker runs');
like($scraped{app} // '', qr/^eventgrid_replication_slot_active\{[^}]*slot="sub_app34"[^}]*\} 1$/m,
	"the exporter shows the application server's slots");

# --- failover of the application's primary to a physical standby ----------
$app->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($app, 'base', has_streaming => 1);
$standby->start;
# delivery server 1 falls behind (its subscription disabled), then the primary fails
$d1->safe_psql('postgres', 'ALTER SUBSCRIPTION sub_app DISABLE');
my @fo = map { "fo-$_" } 1 .. 10;
publish($app, 'tp1', @fo);
$app->wait_for_catchup($standby, 'replay', $app->lsn('insert'));
$app->stop('immediate');
$standby->promote;
# the documented re-feed: the slot is gone with the old primary; the
# subscription is made again against the new primary, copying what its
# event tables hold (eventgrid.event_retention keeps it)
$d1->safe_psql('postgres', 'ALTER SUBSCRIPTION sub_app SET (slot_name = NONE)');
$d1->safe_psql('postgres', 'DROP SUBSCRIPTION sub_app');
$d1->safe_psql('postgres', "CREATE SUBSCRIPTION sub_app CONNECTION '" . conninfo($standby)
	  . "' PUBLICATION pub_12 WITH (copy_data = true)");
$seen = all_arrived('/d1/s1', \@fo);
is(scalar(grep { $seen->{$_} } @fo), 10, 'failover: events the delivery server had not received are delivered');
publish($standby, 'tp1', 'new-primary-1');
$seen = all_arrived('/d1/s1', ['new-primary-1']);
is($seen->{'new-primary-1'}, 1, 'events published on the new primary are delivered');

$standby->stop;
done_testing();
