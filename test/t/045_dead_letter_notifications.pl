# Dead-letter notifications always fit and cannot be suppressed (issue
# "Trust, third pass", item 3):
#  - an event with a 530,000-character subject, dead-lettered by a
#    subscription with a dead_letter_topic: the notification repeats the
#    subject cut to 1,024 characters, carries the event, stays within 1 MB,
#    and the subscription goes on (it stalled for good in 0.10.0: recording
#    the outcome failed at every attempt); the same with a 950,000-character
#    subject (the event left out) and for a dropped event (no deadletter);
#  - a publisher that gives its events the notification's event type
#    (Eventgrid.EventSubscription.EventDeadLettered) still gets them notified;
#  - a notification that is itself dead-lettered notifies no one, whatever
#    its type: eventgrid tells its own notifications apart by their origin
#    (events.source), which publishers cannot write;
#  - a notification that cannot be made (an operator's trigger refuses its
#    topic) does not hold the dead letter back: it is kept in
#    dead_letter_notification_failures and logged, once per record, without
#    its message; the notifications of the same records that can be made
#    are published.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('dead_letter_notifications');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;
sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('shop')");
sql("SELECT eventgrid.create_topic('alerts')");
sql("SELECT eventgrid.create_event_subscription('shop', 'refusing', '$u/status/400/refusing', deadletter => true,"
	  . " dead_letter_topic => 'alerts')");
sql("SELECT eventgrid.create_event_subscription('shop', 'dropping', '$u/status/400/dropping',"
	  . " dead_letter_topic => 'alerts')");
# the notification topic's own subscription dead-letters into it
sql("SELECT eventgrid.create_event_subscription('alerts', 'looping', '$u/status/400/looping', deadletter => true,"
	  . " dead_letter_topic => 'alerts')");
sql("CREATE ROLE app LOGIN; GRANT eventgrid_publisher TO app");

sub publish_as_app
{
	my ($event) = @_;
	my ($ret, $out, $err) = $node->psql('postgres', "INSERT INTO eventgrid.events (topic, event) VALUES ('shop', \$j\$$event\$j\$)",
		extra_params => [ '-U', 'app' ]);
	is($ret, 0, 'the publisher publishes') or diag($err);
}

my $long = 'x' x 530_000;
my $longer = 'y' x 950_000;
publish_as_app(eg_event('long', subject => "/s/$long"));
publish_as_app(eg_event('longer', subject => "/s/$longer"));
publish_as_app(eg_event('forged', eventType => 'Eventgrid.EventSubscription.EventDeadLettered'));
publish_as_app(eg_event('after'));

ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE topic = 'shop'", '4', 60),
	'all four events dead-lettered by refusing: nothing stalls the subscription');
ok(wait_for_sql($node, "SELECT dropped FROM eventgrid.delivery_statistics WHERE subscription = 'dropping'", '4', 60),
	'and all four dropped by dropping');
is(sql("SELECT sum(pending) FROM eventgrid.delivery_statistics WHERE topic = 'shop'"), '0', 'nothing is pending');

# the notifications, published to alerts, reach its subscription looping,
# which dead-letters them: its dead letters hold them as they were published
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'looping'", '8', 60),
	'the notification topic\'s subscription got eight notifications and dead-lettered them');
my $notes = sub {
	return sql("SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'looping'"
		  . " AND event->'data'->>'eventSubscription' = '$_[0]'");
};
is($notes->('refusing'), '4', 'each dead-lettered event notified once, the forged type too');
is($notes->('dropping'), '4', 'each dropped event notified once');
is(sql("SELECT max(octet_length(event::text)) <= 1048576 FROM eventgrid.dead_letters WHERE subscription_name = 'looping'"), 't',
	'every notification is within 1 MB');
my $note = sub {
	my ($id, $what) = @_;
	return sql("SELECT $what FROM eventgrid.dead_letters WHERE subscription_name = 'looping'"
		  . " AND event->'data'->>'id' = '$id' AND event->'data'->>'eventSubscription' = 'refusing'");
};
is($note->('long', "length(event->'data'->>'subject') || ' ' || (event->'data'->'event'->>'subject' = '/s/$long')"),
	'1024 true', 'the 530,000-character subject is repeated cut to 1,024 characters, the event whole');
is($note->('longer', "length(event->'data'->>'subject') || ' ' || (event->'data' ? 'event') || ' ' || (event->'data' ? 'eventOmitted')"),
	'1024 false true', 'the 950,000-character one: cut, the event left out');
is($note->('forged', "event->>'eventType' || ' ' || (event->'data'->>'eventType')"),
	'Eventgrid.EventSubscription.EventDeadLettered Eventgrid.EventSubscription.EventDeadLettered',
	'the event that wore the notification type is notified like any other');

# none of looping's dead letters notifies again
sleep 3;
is(sql("SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'looping'"), '8',
	'a notification that is itself dead-lettered notifies no one: no loop');
is(sql("SELECT count(*) FROM eventgrid.dead_letters WHERE event->'data'->>'eventSubscription' = 'looping'"), '0',
	'no notification of looping\'s dead letters was made');
is(sql("SELECT count(DISTINCT source) || ' ' || min(source) FROM eventgrid.dead_letters WHERE subscription_name = 'looping'"),
	'1 (dead-letter notification)', 'their dead letters name their origin');

# a publisher cannot give its events that origin
my ($ret, $out, $err) = $node->psql('postgres',
	"INSERT INTO eventgrid.events (topic, event, source) VALUES ('shop', '" . eg_event('origin') . "', '(dead-letter notification)')",
	extra_params => [ '-U', 'app' ]);
like($err, qr/permission denied/, 'a publisher cannot write events.source');

# notifications that cannot be made
sql("SELECT eventgrid.create_topic('broken-alerts')");
sql("CREATE FUNCTION refuse_broken() RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN"
	  . " IF NEW.topic = 'broken-alerts' THEN RAISE EXCEPTION 'refused by the operator''s trigger: %', NEW.event->>'id'"
	  . " USING ERRCODE = 'check_violation'; END IF; RETURN NEW; END \$\$;"
	  . " CREATE TRIGGER refuse_broken BEFORE INSERT ON eventgrid.events FOR EACH ROW EXECUTE FUNCTION refuse_broken()");
sql("SELECT eventgrid.create_event_subscription('shop', 'refusing2', '$u/status/400/refusing2', deadletter => true,"
	  . " dead_letter_topic => 'broken-alerts')");
sql("SELECT eventgrid.create_event_subscription('shop', 'refusing3', '$u/status/400/refusing3', deadletter => true,"
	  . " dead_letter_topic => 'alerts')");
my $log_at = -s $node->logfile;
publish_as_app(eg_event("broken-$_")) for 1 .. 3;
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'refusing2'", '3', 60),
	'the dead letters are recorded although their notifications cannot be made');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'refusing3'", '3', 60),
	'and those of a subscription beside it');
is(sql("SELECT sum(pending) FROM eventgrid.delivery_statistics WHERE topic = 'shop'"), '0', 'nothing is held back');
is(sql("SELECT count(*) || ' ' || min(sqlstate) || ' ' || min(dead_letter_topic) || ' ' || min(topic)"
	  . " || ' ' || bool_and(error LIKE 'refused by the operator''s trigger%')"
	  . " FROM eventgrid.dead_letter_notification_failures WHERE subscription_name = 'refusing2'"),
	'3 23514 broken-alerts shop true', 'each notification that could not be made is kept, with its SQLSTATE and error');
is(sql("SELECT count(*) FROM eventgrid.dead_letter_notification_failures f JOIN eventgrid.dead_letters d"
	  . " ON d.event_id = f.event_id AND d.subscription_id = f.subscription_id"),
	'3', 'and names the dead letter it belongs to');
is(sql("SELECT count(*) FROM eventgrid.dead_letter_notification_failures WHERE subscription_name <> 'refusing2'"), '0',
	'no other notification failed');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'looping'"
		  . " AND event->'data'->>'eventSubscription' = 'refusing3'", '3', 60),
	'the notifications that could be made were published');
# eventgrid's own lines (the test's statements are logged too)
my $log = join('', grep { /LOG:  eventgrid:|WARNING|ERROR/ } split /^/, slurp_file($node->logfile, $log_at));
like($log, qr/dead-letter notification\(s\) could not be published \(SQLSTATE 23514 first\)/, 'the failures are logged');
unlike($log, qr/refused by the operator|broken-\d/, 'without their message or anything of the event');
sql("DROP TRIGGER refuse_broken ON eventgrid.events");

$node->stop;
done_testing();
