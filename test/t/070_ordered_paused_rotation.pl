# Keyed events that the rotation moves into the retries stay behind their
# key's head (issue "Trust, fifth pass", item 10: a planted defect that
# made them all due passed every test).  An ordered event subscription is
# paused while five events of one key are published; the event tables turn
# (2 s), so the upkeep worker moves its waiting events into its retries: one
# of them, the key's head, may be due, the other four wait behind it.
# Resumed, they are delivered one request at a time, in publish order, to a
# receiver that takes 300 ms to answer.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP qw(decode_json);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('ordered_paused', 'eventgrid.event_table_rotation' => "'2s'");
my $r = start_receiver();
my $path = '/status/200/ordered';
sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('orders')");
sql("SELECT eventgrid.create_event_subscription('orders', 'ordered', '$r->{url}$path?delay_ms=300', ordering_key => 'subject')");
sql("SELECT eventgrid.pause_delivery('orders', 'ordered')");
sql("SELECT eventgrid.publish('orders', '[" . join(',', map { eg_event("e$_", subject => '/orders/k') } 1 .. 5) . "]')");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '5', 60),
	'paused across the event tables\' turns: its five events were moved into its retries');
is(sql("SELECT count(*) FILTER (WHERE next_attempt_at <> 'infinity') || ' ' || count(*) FILTER (WHERE next_attempt_at = 'infinity')"
		  . " FROM eventgrid.retries"), '1 4', 'the key\'s head may be due; the other four wait behind it');
is(sql("SELECT r.event->>'id' FROM eventgrid.retries r JOIN eventgrid.ordering_keys k ON k.head_id = r.id"), 'e1',
	'the head is the first published');

sql("SELECT eventgrid.resume_delivery('orders', 'ordered')");
ok(wait_for_requests($r, $path, 5), 'resumed: five requests');
my @reqs = requests($r, $path);
is(join(',', map { decode_json($_->{body})->[0]{id} } @reqs), 'e1,e2,e3,e4,e5', 'in publish order');
my @gaps = map { $reqs[$_]{time} - $reqs[ $_ - 1 ]{time} } 1 .. $#reqs;
ok(!grep({ $_ < 0.25 } @gaps), 'one request at a time (each sent after the 300 ms answer to the one before): '
	  . join(', ', map { sprintf('%.2f s', $_) } @gaps));

$node->stop;
done_testing();
