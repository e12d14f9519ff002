from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobqueue', '0007_flows'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='flow',
            field=models.JSONField(blank=True, null=True),
        ),
    ]
