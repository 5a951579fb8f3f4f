# Replicated rows are events (issue "Trust, third pass", item 7): a
# delivery server fed by logical replication checks every applied row as a
# publish would.  Rows written on the application server around its publish
# trigger (a superuser in session_replication_role = replica) reach the
# delivery server: a JSON array, a scalar, a JSON null, an Event Grid event
# without eventType, one whose id holds a line break, and a valid event with
# a forged event_bytes.  The five invalid ones are kept apart in
# eventgrid.rejected_events with the reason a publish gives, never
# delivered; replication goes on (the valid events before and after them
# arrive, the apply worker keeps running); the forged size is made again
# here; the log says so once; pg_monitor reads the table.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $app = PostgreSQL::Test::Cluster->new('app');
$app->init(allows_streaming => 'logical');
$app->append_conf('postgresql.conf', "shared_preload_libraries = 'eventgrid'\n");
$app->start;
$app->safe_psql('postgres', 'CREATE EXTENSION eventgrid');
my $d = new_node('delivery');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

$app->safe_psql('postgres', "SELECT eventgrid.create_topic('orders'); SELECT eventgrid.create_event_publication('pub')");
$d->safe_psql('postgres', "SELECT eventgrid.create_topic('orders');"
	  . " SELECT eventgrid.create_event_subscription('orders', 'sink', '$u/status/200/sink')");
my $conn = sprintf('host=%s port=%d dbname=postgres', $app->host, $app->port);
$d->safe_psql('postgres', "CREATE SUBSCRIPTION sub_app CONNECTION '$conn' PUBLICATION pub");

sub arrived
{
	my %seen;
	$seen{ $_->{id} }++ for map { @{ $json->decode($_->{body}) } } requests($r, '/status/200/sink');
	return \%seen;
}

$app->safe_psql('postgres', "SELECT eventgrid.publish('orders', '" . eg_event('before') . "')");
is(scalar(wait_for_requests($r, '/status/200/sink', 1, 30)), 1, 'a valid event arrives through replication');

# around the publish trigger, as a superuser may
my $valid = eg_event('forged-size');
my $no_type = $json->encode({ id => 'no-type', subject => '/s', eventTime => '2024-05-01T12:00:00Z', data => {} });
my $crlf = eg_event("line\r\nX-Injected: 1");
$app->safe_psql('postgres', qq{
	SET session_replication_role = replica;
	INSERT INTO eventgrid.events (topic, event, publish_time, event_bytes) VALUES
	  ('orders', '[1, 2]', now(), 6),
	  ('orders', '"scalar"', now(), 8),
	  ('orders', 'null', now(), 4),
	  ('orders', '$no_type', now(), 10),
	  ('orders', '$crlf', now(), 10),
	  ('orders', '$valid', now(), 5);
});
$app->safe_psql('postgres', "SELECT eventgrid.publish('orders', '" . eg_event('after') . "')");

ok(wait_for_sql($d, "SELECT count(*) FROM eventgrid.rejected_events", '5', 30), 'five rows kept apart on the delivery server');
my $seen;
for (1 .. 100)
{
	$seen = arrived();
	last if $seen->{after} && $seen->{'forged-size'};
	usleep(100_000);
}
is(join(' ', sort keys %$seen), 'after before forged-size', 'replication went on: the valid events arrived, no other');
is($d->safe_psql('postgres', "SELECT event_bytes = octet_length(event::text) FROM eventgrid.events"
		  . " WHERE event->>'id' = 'forged-size'"), 't', 'the forged event_bytes (5) was made again from the event');
is($d->safe_psql('postgres', "SELECT string_agg(coalesce(event::text, 'NULL') || ' | ' || reason, E'\\n' ORDER BY id)"
		  . " FROM eventgrid.rejected_events"),
	join("\n",
		'[1, 2] | an event must be a JSON object',
		'"scalar" | an event must be a JSON object',
		'null | an event must be a JSON object',
		'{"id": "no-type", "data": {}, "subject": "/s", "eventTime": "2024-05-01T12:00:00Z"} | event is missing required field "eventType"',
		$d->safe_psql('postgres', "SELECT event::text FROM eventgrid.rejected_events WHERE event->>'id' LIKE 'line%'")
		  . ' | event field "id" must not contain control characters'),
	'each with the reason a publish gives');
is($d->safe_psql('postgres', "SELECT count(DISTINCT source) || ' ' || min(source) || ' ' || count(source_event_id)"
		  . " FROM eventgrid.rejected_events"), '1 sub_app 5', 'naming the subscription and the id each had where published');
is($d->safe_psql('postgres', "SELECT apply_pid IS NOT NULL FROM eventgrid.replication_sources"), 't', 'the apply worker runs on');
my @logged = slurp_file($d->logfile) =~ /brought a row that is not a valid event/g;
is(scalar(@logged), 1, 'the log says so once');
unlike(slurp_file($d->logfile), qr/X-Injected/, 'and repeats nothing of the rows');
$d->safe_psql('postgres', "CREATE ROLE watcher LOGIN IN ROLE pg_monitor");
my ($ret, $out, $err) = $d->psql('postgres', 'SELECT count(*) FROM eventgrid.rejected_events', extra_params => [ '-U', 'watcher' ]);
is($out, '5', 'pg_monitor reads eventgrid.rejected_events');

$d->safe_psql('postgres', 'DROP SUBSCRIPTION sub_app');
$d->stop;
$app->stop;
done_testing();
