# Dead letters delivered again and purged (SPEC 7): redeliver_dead_letters()
# queues the selected dead letters as fresh deliveries (no attempts made,
# time-to-live from now) that the worker sends at once, counts them, and a
# second call by mistake queues nothing; purge_dead_letters() deletes the
# selected ones.  The dead letter keeps the id publish() returned.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('replay');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('shop')");
# the first request to each path is refused with 400 (not retried), the next ones succeed
sql("SELECT eventgrid.create_event_subscription('shop', 'flaky', '$u/seq/400,200,200/flaky', deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('shop', 'refusing', '$u/status/400/refusing', deadletter => true)");
my $ids = sql("SELECT eventgrid.publish('shop', '" . eg_event('r-1') . "')");
like($ids, qr/^\{\d+\}$/, 'publish() returns the event id');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters", '2'), 'both subscriptions dead-lettered the event');
is(sql("SELECT string_agg(DISTINCT event_id::text, ',') FROM eventgrid.dead_letter_events"), substr($ids, 1, -1),
	'the dead letters carry the id publish() returned');

is(sql("SELECT eventgrid.redeliver_dead_letters(subscription => 'flaky', reason => 'NonRetriableError')"), '1',
	'one dead letter queued again');
is(sql("SELECT eventgrid.redeliver_dead_letters(subscription => 'flaky')"), '0', 'a second call queues nothing');
my @flaky = wait_for_requests($r, '/seq/400,200,200/flaky', 2, 30);
is(scalar @flaky, 2, 'the redelivered event was sent again');
is($json->decode($flaky[1]{body})->[0]{id}, 'r-1', 'the same event');
is($flaky[1]{headers}{'aeg-delivery-count'}, '0', 'with fresh attempts');
ok(wait_for_sql($node, "SELECT delivered || '/' || dead_lettered || '/' || redelivered || '/' || pending"
	  . " FROM eventgrid.delivery_statistics WHERE subscription = 'flaky'", '1/1/1/0'),
	'delivered, and counted: 1 dead-lettered, 1 redelivered, nothing pending');
is(sql("SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'flaky'"), '0', 'its dead letter is gone');

# a dead letter redelivered to a refusing endpoint is dead-lettered again
is(sql("SELECT eventgrid.redeliver_dead_letters('shop', 'refusing')"), '1', 'the other one queued again');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'refusing'", '1'),
	'refused again: dead-lettered again');
is(scalar(requests($r, '/status/400/refusing')), 2, 'after one more attempt');

# purge by filter; dead letters of a dropped subscription are not redelivered
sql("SELECT eventgrid.drop_event_subscription('shop', 'refusing')");
is(sql("SELECT eventgrid.redeliver_dead_letters('shop')"), '0', 'nothing to redeliver for a dropped subscription');
is(sql("SELECT eventgrid.purge_dead_letters(reason => 'TimeToLiveExceeded')"), '0', 'purge by another reason: none');
is(sql("SELECT eventgrid.purge_dead_letters(dead_lettered_before => now() - interval '1 hour')"), '0',
	'purge before a time: none');
is(sql("SELECT eventgrid.purge_dead_letters('shop', 'refusing')"), '1', 'purged, by the name of a dropped subscription');
like(sql_error($node, "SELECT eventgrid.purge_dead_letters('shop', 'refusing')"),
	qr/42704: event subscription "refusing" does not exist for topic "shop"/,
	'once no dead letter names it either, the name is unknown (42704)');
is(sql("SELECT eventgrid.purge_dead_letters('shop', 'flaky')"), '0', 'a purge of an existing subscription with nothing to purge deletes nothing');
like(sql_error($node, "SELECT eventgrid.redeliver_dead_letters(topic => 'nope')"), qr/42704: topic "nope" does not exist/,
	'redelivering for an unknown topic is an error, as in drop_topic() (42704)');
is(sql("SELECT count(*) FROM eventgrid.dead_letters"), '0', 'no dead letters left');

$node->stop;
done_testing();
