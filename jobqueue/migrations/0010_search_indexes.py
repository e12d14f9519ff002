import django.db.models.fields.json
import django.db.models.functions.text
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobqueue', '0009_durable_flows'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='handler',
            field=models.GeneratedField(db_persist=True, expression=django.db.models.functions.text.Left(django.db.models.fields.json.KeyTextTransform('handler', 'payload'), 200), output_field=models.CharField(max_length=200, null=True)),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['unique_key', 'finished_at'], name='jq_job_unique_key'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['handler', 'finished_at'], name='jq_job_handler'),
        ),
    ]
