from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobqueue', '0008_durable_expiry_and_retry'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='flow',
            field=models.JSONField(blank=True, null=True),
        ),
    ]
