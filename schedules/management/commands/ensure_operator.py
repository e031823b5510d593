"""`manage.py ensure_operator --username U --password P [--email E] [--role R] [--tenants T,...]`: create or update
a console operator: a platform operator (superuser, every tenant), or an operator or read-only operator of the
tenants named (tenants/access.py)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import validate_email
from django.db import transaction
from django_tenants.utils import get_public_schema_name, schema_context

from tenants.access import OPERATOR_GROUP, READ_ONLY_GROUP
from tenants.models import OperatorAccess, Tenant

ROLES = {"platform": None, "operator": OPERATOR_GROUP, "read-only": READ_ONLY_GROUP}
EVERY_TENANT = "*"


class Command(BaseCommand):
    help = (
        "Create or update a console operator (in the public schema) who signs in at /admin/ on the public host: "
        "a platform operator (superuser), or an operator or read-only operator of the tenants given. Idempotent: "
        "running it again resets the password, the role and the tenants."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", required=True, help="operator's login name")
        parser.add_argument("--password", required=True, help="operator's password (checked by the validators)")
        parser.add_argument("--email", help="operator's e-mail address (kept unchanged when omitted)")
        parser.add_argument(
            "--role",
            choices=sorted(ROLES),
            default="platform",
            help="platform: a superuser of every tenant (the default); operator: views and acts (pause, cancel, "
            "edit, run now, backfill, replay); read-only: views",
        )
        parser.add_argument(
            "--tenants",
            default="",
            help="for operator and read-only: the tenant slugs they see, comma-separated, or * for every tenant",
        )

    def handle(self, *args, **options) -> None:
        User = get_user_model()
        username = (options["username"] or "").strip()
        password = options["password"] or ""
        email = options["email"]
        self._validate(User, username, password, email)
        role = options["role"]
        tenants = self._tenants(role, options["tenants"])

        # Operators live in the public schema; tenant schemas hold only each tenant's own API users.
        with schema_context(get_public_schema_name()), transaction.atomic():
            user = User.objects.select_for_update().filter(**{User.USERNAME_FIELD: username}).first()
            created = user is None
            if user is None:
                user = User(**{User.USERNAME_FIELD: username})
            if email is not None:
                user.email = email.strip()
            user.is_staff = True
            user.is_superuser = ROLES[role] is None
            user.is_active = True
            user.set_password(password)
            user.save()
            self._grant(user, role, tenants)
        scope = "every tenant" if tenants is None else ", ".join(t.slug for t in tenants) or "no tenant yet"
        self.stdout.write(f"{'created' if created else 'updated'} operator {username} ({role}; {scope})")

    def _tenants(self, role: str, value: str) -> list[Tenant] | None:
        """The tenants named by --tenants (None: every tenant); refuses unknown slugs and a platform's list."""
        value = value.strip()
        if ROLES[role] is None:
            if value:
                raise CommandError("--tenants is for --role operator or read-only: a platform operator sees them all.")
            return None
        if value == EVERY_TENANT:
            return None
        slugs = [slug.strip() for slug in value.split(",") if slug.strip()]
        found = {t.slug: t for t in Tenant.objects.filter(slug__in=slugs).exclude(schema_name="public")}
        unknown = [slug for slug in slugs if slug not in found]
        if unknown:
            raise CommandError(f"Unknown tenant(s) in --tenants: {', '.join(unknown)}.")
        return [found[slug] for slug in slugs]

    def _grant(self, user, role: str, tenants: list[Tenant] | None) -> None:
        """Exactly the role's group and tenant access: running again with another role replaces them."""
        from django.contrib.auth.models import Group

        group_name = ROLES[role]
        user.groups.remove(*Group.objects.filter(name__in=[OPERATOR_GROUP, READ_ONLY_GROUP]))
        if group_name is None:
            OperatorAccess.objects.filter(user=user).delete()
            return
        user.groups.add(Group.objects.get(name=group_name))
        access, _ = OperatorAccess.objects.update_or_create(user=user, defaults={"all_tenants": tenants is None})
        access.tenants.set(tenants or [])

    def _validate(self, User, username: str, password: str, email: str | None) -> None:
        if not username:
            raise CommandError("--username must not be empty.")
        try:
            User._meta.get_field(User.USERNAME_FIELD).run_validators(username)
        except ValidationError as exc:
            raise CommandError(f"Invalid --username {username!r}: {' '.join(exc.messages)}") from None
        if not password:
            raise CommandError("--password must not be empty.")
        try:
            validate_password(password, User(**{User.USERNAME_FIELD: username}))
        except ValidationError as exc:
            raise CommandError(f"Password refused: {' '.join(exc.messages)}") from None
        if email is not None and email.strip():
            try:
                validate_email(email.strip())
            except ValidationError:
                raise CommandError(f"Invalid --email {email!r}.") from None
