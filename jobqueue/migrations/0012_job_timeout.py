from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobqueue', '0011_job_changed_at'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='timeout_ms',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
