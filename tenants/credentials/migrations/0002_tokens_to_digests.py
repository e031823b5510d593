"""Plaintext keys of rest_framework.authtoken become digests: each key keeps working, as a write token named after
its user that ends 90 days after this migration, and its plaintext row is deleted."""

import hashlib
from datetime import timedelta

from django.db import migrations
from django.utils import timezone

GRACE = timedelta(days=90)


def keys_to_digests(apps, schema_editor):
    Token = apps.get_model("authtoken", "Token")
    ApiToken = apps.get_model("credentials", "ApiToken")
    ends = timezone.now() + GRACE
    for token in Token.objects.select_related("user"):
        ApiToken.objects.get_or_create(
            digest=hashlib.sha256(token.key.encode()).hexdigest(),
            defaults={
                "name": token.user.username[:100],
                "scope": "write",
                "prefix": token.key[:8],
                "created_at": token.created,
                "created_by": "migration from plaintext keys",
                "expires_at": ends,
            },
        )
    Token.objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("credentials", "0001_initial"),
        ("authtoken", "0004_alter_tokenproxy_options"),
    ]

    operations = [migrations.RunPython(keys_to_digests, migrations.RunPython.noop)]
