# Advanced filters on the wire (SPEC 9): the delivery worker sends each
# event only to the subscriptions whose advanced filters it passes (filters
# AND'ed, values OR'ed, strings case-insensitive, missing keys, arrays on
# and off, keys in either schema), counts events no subscription takes as
# unmatched, applies changed filters to events published after the change,
# and leaves nothing pending.  The operators one by one are in the
# pg_regress suite "filters".
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('filters');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }

# ids of the events the receiver got on $path, sorted
sub ids
{
	my ($path, $n) = @_;
	my @got = wait_for_requests($r, $path, $n, 30);
	return join(' ', sort map {
		my $b = $json->decode($_->{body});
		ref $b eq 'ARRAY' ? $b->[0]{id} : $b->{id}
	} @got);
}

sub publish
{
	my ($topic, $id, $data) = @_;
	my $ev = eg_event($id, data => $data);
	sql("SELECT eventgrid.publish('$topic', \$\$$ev\$\$)");
}

sql("SELECT eventgrid.create_topic('shop')");
sql(qq{SELECT eventgrid.create_event_subscription('shop', 'big-blue', '$u/ok/big-blue',
	advanced_filters => '[{"operatorType": "NumberGreaterThan", "key": "data.total", "value": 100},
	                      {"operatorType": "StringIn", "key": "data.color", "values": ["blue", "green"]}]')});
sql(qq{SELECT eventgrid.create_event_subscription('shop', 'vip-arrays', '$u/ok/vip-arrays',
	advanced_filters => '[{"operatorType": "StringIn", "key": "data.tags", "values": ["VIP"]}]',
	enable_advanced_filtering_on_arrays => true)});
sql(qq{SELECT eventgrid.create_event_subscription('shop', 'vip-plain', '$u/ok/vip-plain',
	advanced_filters => '[{"operatorType": "StringIn", "key": "data.tags", "values": ["VIP"]}]')});
sql(qq{SELECT eventgrid.create_event_subscription('shop', 'not-red', '$u/ok/not-red',
	advanced_filters => '[{"operatorType": "StringNotIn", "key": "data.color", "values": ["red"]}]')});
sql(qq{SELECT eventgrid.create_event_subscription('shop', 'typed', '$u/ok/typed',
	included_event_types => ARRAY['Shop.OrderCreated'],
	advanced_filters => '[{"operatorType": "StringBeginsWith", "key": "subject", "values": ["/ORDERS/E"]},
	                      {"operatorType": "IsNullOrUndefined", "key": "data.cancelled"}]')});
sql("SELECT eventgrid.create_event_subscription('shop', 'everything', '$u/ok/everything')");

publish('shop', 'e1', { total => 150, color => 'BLUE', tags => [ 'new', 'vip' ] });
publish('shop', 'e2', { total => 50, color => 'blue' });
publish('shop', 'e3', { total => 200, color => 'red', tags => 'vip' });
publish('shop', 'e4', {});
publish('shop', 'e5', { total => '500', color => 'green', cancelled => JSON::PP::true });

is(ids('/ok/everything', 5), 'e1 e2 e3 e4 e5', 'a subscription without filters gets every event');
is(ids('/ok/big-blue', 1), 'e1', 'filters are AND\'ed, values OR\'ed, strings case-insensitive; "500" is not a number');
is(ids('/ok/vip-arrays', 2), 'e1 e3', 'arrays on: an array matches when an element does; a plain value still matches');
is(ids('/ok/vip-plain', 1), 'e3', 'arrays off: an array value matches nothing');
is(ids('/ok/not-red', 4), 'e1 e2 e4 e5', 'StringNotIn: a missing key matches');
is(ids('/ok/typed', 4), 'e1 e2 e3 e4', 'advanced filters AND the event type filter; IsNullOrUndefined');

# --- changed filters apply to events published after the change
sql(qq{SELECT eventgrid.set_advanced_filters('shop', 'big-blue',
	'[{"operatorType": "NumberInRange", "key": "data.total", "values": [[0, 10], [90, 99]]}]')});
publish('shop', 'e6', { total => 95 });
publish('shop', 'e7', { total => 50 });
is(ids('/ok/everything', 7), 'e1 e2 e3 e4 e5 e6 e7', 'the later events are delivered');
is(ids('/ok/big-blue', 2), 'e1 e6', 'the new filters take the later events');
sql("SELECT eventgrid.set_advanced_filters('shop', 'big-blue', NULL)");
publish('shop', 'e8', { total => 1000 });
is(ids('/ok/big-blue', 3), 'e1 e6 e8', 'filters removed: every later event');

# --- a CloudEvents topic: the keys of either schema find the envelope fields
sql("SELECT eventgrid.create_topic('ce-shop', 'CloudEventSchemaV1_0')");
sql(qq{SELECT eventgrid.create_event_subscription('ce-shop', 'ce-typed', '$u/ok/ce-typed',
	advanced_filters => '[{"operatorType": "StringIn", "key": "eventType", "values": ["shop.ordercreated"]},
	                      {"operatorType": "StringContains", "key": "comexampleregion", "values": ["EU"]}]')});
for my $e ([ 'c1', 'Shop.OrderCreated', 'eu-west' ], [ 'c2', 'Shop.OrderShipped', 'eu-west' ], [ 'c3', 'Shop.OrderCreated', 'us' ])
{
	my $ev = $json->encode({ specversion => '1.0', id => $e->[0], source => '/shop', type => $e->[1],
		comexampleregion => $e->[2], data => {} });
	sql("SELECT eventgrid.publish('ce-shop', \$\$$ev\$\$)");
}
is(ids('/ok/ce-typed', 1), 'c1', 'CloudEvents: eventType finds type, extension attributes are keys');

# --- events no subscription takes are counted as unmatched
sql("SELECT eventgrid.create_topic('lonely')");
sql(qq{SELECT eventgrid.create_event_subscription('lonely', 'picky', '$u/ok/picky',
	advanced_filters => '[{"operatorType": "BoolEquals", "key": "data.urgent", "value": true}]')});
publish('lonely', 'l1', { urgent => JSON::PP::true });
publish('lonely', 'l2', { urgent => JSON::PP::false });
publish('lonely', 'l3', { urgent => 'true' });
is(ids('/ok/picky', 1), 'l1', 'BoolEquals takes only the boolean');
ok(wait_for_sql($node, "SELECT unmatched_events FROM eventgrid.topic_statistics WHERE topic = 'lonely'", '2', 30),
	'the two events the filter left out are counted as unmatched');

ok(wait_for_sql($node, "SELECT sum(pending) FROM eventgrid.delivery_statistics", '0', 30),
	'nothing pending: filtered-out events are not deliveries');
is(sql("SELECT string_agg(subscription || ':' || delivered, ' ' ORDER BY subscription) FROM eventgrid.delivery_statistics WHERE topic = 'shop'"),
	'big-blue:3 everything:8 not-red:7 typed:7 vip-arrays:2 vip-plain:1',
	'each subscription counted what it was sent');
is(scalar(requests($r)), 3 + 8 + 7 + 7 + 2 + 1 + 1 + 1, 'no other request was sent');

$node->stop;
done_testing();
