# Endpoint validation, Event Grid's handshake (issue "Receivers can verify
# and push back", item 4): with endpoint_validation => 'handshake' a
# subscription gets Event Grid's SubscriptionValidationEvent (CloudEvents:
# the webhook OPTIONS request) and nothing is delivered until the endpoint
# is validated; answered, answered for manual validation, ignored, a wrong
# code, the CloudEvents origin and rate, a new endpoint validated again,
# the manual validation's 10 minutes, and who may do what.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;

my $node = new_node('validation');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }
sub ops { return $node->safe_psql('postgres', "SET ROLE ops; " . shift) }

sub fails { return sql_error($node, @_) }

sub state_of
{
	my ($sub) = @_;
	return "SET ROLE ops; SELECT provisioning_state FROM eventgrid.event_subscription_validation WHERE subscription = '$sub'";
}

sub publish
{
	my ($topic, @ids) = @_;
	sql("SELECT eventgrid.publish('$topic', '[" . join(',', map { eg_event($_) } @ids) . "]')");
}

sub deliveries { return grep { ($_->{headers}{'aeg-event-type'} // '') eq 'Notification' } requests($r, shift) }

sql("CREATE ROLE ops LOGIN IN ROLE eventgrid_admin; CREATE ROLE app LOGIN IN ROLE eventgrid_publisher");
sql("SELECT eventgrid.create_topic('work')");
sql("SELECT eventgrid.create_topic('cloud', 'CloudEventSchemaV1_0')");

# --- answered: validated at once, then delivered
ops("SELECT eventgrid.create_event_subscription('work', 'auto', '$u/validate/auto/a', endpoint_validation => 'handshake')");
ok(wait_for_sql($node, state_of('auto'), 'Succeeded', 30), 'auto: the endpoint answered the handshake: Succeeded');
my ($v) = requests($r, '/validate/auto/a');
my $ev = $json->decode($v->{body})->[0];
is($v->{headers}{'aeg-event-type'}, 'SubscriptionValidation', 'auto: the request has aeg-event-type SubscriptionValidation');
is($ev->{eventType}, 'Microsoft.EventGrid.SubscriptionValidationEvent', 'auto: one SubscriptionValidationEvent');
like($ev->{data}{validationCode}, qr/^[0-9A-F-]{36}$/, 'auto: with a random validationCode');
publish('work', 'a-1', 'a-2');
is(scalar(wait_for_requests($r, '/validate/auto/a', 3)), 3, 'auto: its events are delivered (1 validation + 2 events)');

# --- hostile answers (JSON jsonb cannot hold) are a failed try of their own
# subscription only: the one answered well in the same round is validated
sql("BEGIN; SET LOCAL ROLE ops;"
	  . " SELECT eventgrid.create_event_subscription('work', 'hostile-nul', '$u/validate/nul/n', endpoint_validation => 'handshake');"
	  . " SELECT eventgrid.create_event_subscription('work', 'hostile-huge', '$u/validate/huge/h', endpoint_validation => 'handshake');"
	  . " SELECT eventgrid.create_event_subscription('work', 'beside', '$u/validate/auto/b', endpoint_validation => 'handshake');"
	  . " COMMIT");
ok(wait_for_sql($node, state_of('beside'), 'Succeeded', 30), 'hostile: the subscription validated in the same round is Succeeded');
ok(wait_for_sql($node, state_of('hostile-nul'), 'Failed', 40), 'hostile: an answer with \\u0000 is a failed try; three: Failed');
ok(wait_for_sql($node, state_of('hostile-huge'), 'Failed', 40), 'hostile: an answer with 1e1000000 likewise');
is(scalar(requests($r, '/validate/nul/n')) . ' ' . scalar(requests($r, '/validate/huge/h')), '3 3',
	'hostile: three tries each, 5 s apart, not one a second');
like(sql("SET ROLE ops; SELECT last_error FROM eventgrid.event_subscription_validation WHERE subscription = 'hostile-nul'"),
	qr/the answer is not JSON eventgrid can read/, 'hostile: and says why');
my $vlog = slurp_file($node->logfile);
unlike($vlog, qr/ERROR:.*_record_validation|ERROR:  unsupported Unicode|ERROR:  value overflows/,
	'hostile: no ERROR in the log');
unlike($vlog, qr/hostile-(nul|huge)" of topic "work": Succeeded/, 'hostile: and no false Succeeded line');

# --- manual: nothing delivered until validate_event_subscription()
ops("SELECT eventgrid.create_event_subscription('work', 'manual', '$u/validate/manual/m', endpoint_validation => 'handshake')");
ok(wait_for_sql($node, state_of('manual'), 'AwaitingManualAction', 30), 'manual: a 200 without validationResponse: AwaitingManualAction');
publish('work', 'm-1', 'm-2');
sleep 2;
is(scalar(requests($r, '/validate/manual/m')), 1, 'manual: nothing delivered while it waits');
is(sql("SELECT pending FROM eventgrid.delivery_statistics WHERE subscription = 'manual'"), '2', 'manual: its 2 events wait at its position');
my $code = $json->decode((requests($r, '/validate/manual/m'))[0]{body})->[0]{data}{validationCode};
like(fails("SELECT eventgrid.validate_event_subscription('work', 'manual', 'NOT-IT')", 'ops'),
	qr/22023: validation_code is not the code sent to the endpoint/, 'manual: another code is refused (22023)');
like(fails("SELECT eventgrid.validate_event_subscription('work', 'manual', '$code')", 'app'),
	qr/42501: permission denied for function validate_event_subscription/, 'manual: a publisher may not validate (42501)');
ops("SELECT eventgrid.validate_event_subscription('work', 'manual', '$code')");
is(sql(state_of('manual')), 'Succeeded', 'manual: validated by hand with the code the endpoint received');
is(scalar(wait_for_requests($r, '/validate/manual/m', 3)), 3, 'manual: the 2 waiting events are delivered');
like(fails("SELECT eventgrid.validate_event_subscription('work', 'manual', '$code')", 'ops'),
	qr/55000: event subscription "manual" of topic "work" is not awaiting manual validation/, 'manual: not twice (55000)');

# --- ignored (404), a wrong code, and CloudEvents: allowed with a rate, denied
ops("SELECT eventgrid.create_event_subscription('work', 'ignored', '$u/status/404/i', endpoint_validation => 'handshake')");
ops("SELECT eventgrid.create_event_subscription('work', 'wrong', '$u/validate/wrong/w', endpoint_validation => 'handshake')");
ops("SELECT eventgrid.create_event_subscription('cloud', 'allowed', '$u/webhook/allow/c?rate=120', endpoint_validation => 'handshake')");
ops("SELECT eventgrid.create_event_subscription('cloud', 'denied', '$u/webhook/deny/d', endpoint_validation => 'handshake')");
ok(wait_for_sql($node, state_of('wrong'), 'Failed', 30), 'wrong: a validationResponse that is not the code: Failed');
like(sql("SET ROLE ops; SELECT last_error FROM eventgrid.event_subscription_validation WHERE subscription = 'wrong'"),
	qr/validationResponse is not the validation code sent/, 'wrong: and says why');
ok(wait_for_sql($node, state_of('allowed'), 'Succeeded', 30), 'CloudEvents: WebHook-Allowed-Origin * validates');
my ($o) = requests($r, '/webhook/allow/c');
is($o->{method} . ' ' . $o->{headers}{'webhook-request-origin'}, 'OPTIONS eventgrid',
	'CloudEvents: an OPTIONS request with WebHook-Request-Origin');
is(sql("SELECT max_events_per_second FROM eventgrid.event_subscriptions WHERE name = 'allowed'"), '2',
	'CloudEvents: WebHook-Allowed-Rate 120 a minute became 2 events a second');
ok(wait_for_sql($node, state_of('ignored'), 'Failed', 40), 'ignored: three tries answered 404: Failed');
is(scalar(requests($r, '/status/404/i')), 3, 'ignored: three tries');
my @t = map { $_->{time} } requests($r, '/status/404/i');
cmp_ok($t[1] - $t[0], '>=', 4.5, 'ignored: 5 s apart');
like(sql("SET ROLE ops; SELECT last_error FROM eventgrid.event_subscription_validation WHERE subscription = 'ignored'"),
	qr/answered with HTTP 404/, 'ignored: the last error');
ok(wait_for_sql($node, state_of('denied'), 'Failed', 40), 'CloudEvents: no WebHook-Allowed-Origin: Failed');
publish('work', 'i-1');
sleep 2;
is(scalar(requests($r, '/status/404/i')), 3, 'ignored: its events are not delivered');
ok(wait_for_sql($node, "SELECT pending FROM eventgrid.delivery_statistics WHERE subscription = 'ignored'", '0', 10),
	'ignored: nor kept, as Event Grid never creates a subscription whose validation failed');

# --- a new endpoint is validated again; the manual validation's 10 minutes
ops("SELECT eventgrid.update_event_subscription('work', 'auto', endpoint => '$u/validate/manual/m2')");
ok(wait_for_sql($node, state_of('auto'), 'AwaitingManualAction', 30), 'a changed endpoint is validated again');
publish('work', 'a-3');
sleep 1;
is(scalar(requests($r, '/validate/manual/m2')), 1, 'and nothing goes to it meanwhile');
advance_clock($node, 601);
ok(wait_for_sql($node, state_of('auto'), 'Failed', 30), 'not validated by hand within 10 minutes: Failed');
ops("SELECT eventgrid.update_event_subscription('work', 'auto', endpoint => '$u/validate/auto/a2')");
ok(wait_for_sql($node, state_of('auto'), 'Succeeded', 30), 'a new endpoint that answers: Succeeded');
is(scalar(wait_for_requests($r, '/validate/auto/a2', 2)), 2, 'and the event that waited is delivered there');
ops("SELECT eventgrid.update_event_subscription('work', 'ignored', endpoint_validation => 'none')");
publish('work', 'i-2');
my @i = wait_for_requests($r, '/status/404/i', 4);
is(join(',', map { $_->{headers}{'aeg-event-type'} . ' ' . $json->decode($_->{body})->[0]{id} } @i[3 .. $#i]), 'Notification i-2',
	'endpoint_validation none: delivery starts without validation, with what is published from then on');

# --- who sees what
like(fails("SELECT code FROM eventgrid.endpoint_validations", 'ops'), qr/42501: permission denied for table endpoint_validations/,
	'the admin role cannot read the validation codes');
like(fails("SELECT eventgrid.create_event_subscription('work', 'x-1', '$u/x', endpoint_validation => 'maybe')", 'ops'),
	qr/22023: endpoint_validation must be none or handshake, got "maybe"/, 'an unknown endpoint_validation: 22023');
like(slurp_file($node->logfile),
	qr/LOG:  eventgrid: endpoint validation of event subscription "manual" of topic "work": AwaitingManualAction/,
	'the log says what each validation came to');

$node->stop;
done_testing();
