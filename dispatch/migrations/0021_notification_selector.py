"""Notifications follow the target's label selector: the row trigger's function writes a notification only for an
occurrence whose schedule's labels meet it (tenants.NotificationTarget.selector_match: `equal` pairs the labels must
contain, `not_equal` pairs they must not). The stuck search applies the same test (dispatch/sql/notifications.py).

Replacing the function takes no lock on the occurrence table: the triggers stay as they are and call the new body
from the next statement on. The schedule is read by its primary key, once per event (dead, missed, skipped), never
on the hot statements the triggers' WHEN clause leaves out.
"""

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION public.dispatch_occurrence_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.dispatch_notification (tenant_id, event, occurrence_id, scheduled_for, schedule_id, state,
                                              state_reason)
    SELECT NEW.tenant_id, NEW.state, NEW.occurrence_id, NEW.scheduled_for, NEW.schedule_id, NEW.state,
           NEW.state_reason
    FROM public.tenants_notificationtarget AS t
    WHERE t.tenant_id = NEW.tenant_id AND NEW.state = ANY (t.events)
      AND (t.selector_match IS NULL OR EXISTS (
          SELECT 1 FROM public.schedules_schedule AS s
          WHERE s.id = NEW.schedule_id AND s.labels @> (t.selector_match -> 'equal')
            AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(t.selector_match -> 'not_equal') AS e (pair)
                            WHERE s.labels @> e.pair)))
    ON CONFLICT (event, occurrence_id) DO NOTHING;
    RETURN NULL;
END
$$;
"""
PREVIOUS = """
CREATE OR REPLACE FUNCTION public.dispatch_occurrence_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.dispatch_notification (tenant_id, event, occurrence_id, scheduled_for, schedule_id, state,
                                              state_reason)
    SELECT NEW.tenant_id, NEW.state, NEW.occurrence_id, NEW.scheduled_for, NEW.schedule_id, NEW.state,
           NEW.state_reason
    FROM public.tenants_notificationtarget AS t
    WHERE t.tenant_id = NEW.tenant_id AND NEW.state = ANY (t.events)
    ON CONFLICT (event, occurrence_id) DO NOTHING;
    RETURN NULL;
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("dispatch", "0020_notifications"),
        ("tenants", "0008_notification_selector"),
        ("schedules", "0017_schedule_labels"),
    ]

    operations = [migrations.RunSQL(FUNCTION, PREVIOUS)]
